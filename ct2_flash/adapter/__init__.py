"""The faster-whisper adapter: what ``FlashWhisperModel`` puts behind faster-whisper's
``self.model`` seam.

- ``whisper_model``: ``FlashWhisperModel`` and ``BatchedInferencePipeline``, faster-whisper's
  classes with the engines, the drafter and the proxy built in;
- ``speculative_whisper``: ``SpeculativeWhisper``, the proxy faster-whisper calls, which sends
  each ``generate()`` call to the loop or to CTranslate2's own ``generate()``;
- ``routing``: how a call is to be served, one ``Route`` per call, and how it was (``Served``);
- ``engine_pair``: the two engines (the stock worker and the patched runtime) and which one
  serves a call outside the loop;
- ``thread_split``: ``decoder_threads="auto"``;
- ``audio``: audio checks, how much of a window holds audio, and the features computed with
  numpy's BLAS on one thread.
"""
