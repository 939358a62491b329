"""The census's feature: ``watcher`` (what the capture path tells the census of each capture)
and ``compile_skips`` (torch.compile's skipped cudagraphs, where torch counts them). The counts
themselves are cgguard._data.census.

Imports cgguard._core and below; never cgguard._inspect."""
