"""Data strategies: how datasets are mixed into batches."""
