"""``python -m ct2_flash.stock``: install stock ctranslate2 for the worker (what
``scripts/install.sh`` runs) and print where it is."""

from ct2_flash.stock.location import install

print(install())
