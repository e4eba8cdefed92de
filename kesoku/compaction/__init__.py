"""Progressive context compaction (ARCHITECTURE.md, "Windows"): token accounting, the compacted view, the stages."""

from kesoku.compaction.compactor import CompactionPolicy, Compactor
from kesoku.compaction.view import Archive, ViewState

__all__ = ["Archive", "CompactionPolicy", "Compactor", "ViewState"]
