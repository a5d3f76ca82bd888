"""The drivers layer: run scenarios many times under instrumentation options and return results
(`fuzz`, the Hypothesis search; `mutate`, the sync mutation analysis). A driver never prints."""
