"""Progressive context compaction (ARCHITECTURE.md, "Windows"): token accounting and the stages.

The compacted view itself (what the model is sent) is data every layer reads:
:mod:`kesoku.vocab.view`.
"""
