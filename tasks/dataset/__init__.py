"""What the export stage shares: the dataset card, its derived columns, the files of a config."""
