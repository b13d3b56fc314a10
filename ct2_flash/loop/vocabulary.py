"""A CTranslate2 Whisper model directory's vocabulary, special tokens and config.json."""

from __future__ import annotations

import json
import os
from typing import Any, Dict

from ct2_flash.loop.logit_rules import SpecialTokens


def load_config(model_path: str) -> Dict[str, Any]:
    """The model's config.json (suppressed tokens, alignment heads, ...), or {} without one."""
    path = os.path.join(model_path, "config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as stream:
        return json.load(stream)


def load_vocabulary(model_path: str):
    """The CTranslate2 vocabulary (vocabulary.txt or vocabulary.json) and its special ids."""
    text_path = os.path.join(model_path, "vocabulary.txt")
    json_path = os.path.join(model_path, "vocabulary.json")
    if os.path.isfile(text_path):
        with open(text_path, encoding="utf-8") as stream:
            tokens = stream.read().split("\n")
        if tokens and tokens[-1] == "":
            tokens.pop()
    elif os.path.isfile(json_path):
        with open(json_path, encoding="utf-8") as stream:
            tokens = json.load(stream)
    else:
        raise FileNotFoundError(f"no vocabulary.txt or vocabulary.json in {model_path}")
    return SpecialTokens.from_vocabulary(tokens), tokens
