"""bwstack core: typed errors and the one report shape shared by every verb."""
