"""What the export stage shares: the dataset card, the secrets gate."""
