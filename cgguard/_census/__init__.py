"""The census's feature: what the capture path tells the census, and torch.compile's skipped
cudagraphs."""
