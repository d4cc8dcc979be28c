"""Analytics report tables (filled by the nightly Spark job)."""
