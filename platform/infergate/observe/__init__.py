"""What the platform records: metrics, per-version counters and statistics, drift."""
