"""WHETHER it will work: fatbin reader, compatibility rules, loader probe, sources, smoke and preflight."""
