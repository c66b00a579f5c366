"""c4-trace: merges c4comm trace files and reports on them (Python 3 standard library only)."""
