"""Scenario scripts: one broken and one fixed DataLoader program per cause id."""
