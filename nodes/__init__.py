"""Nodes: preflight, provision and fleet rendering; the stage that may use every other."""
