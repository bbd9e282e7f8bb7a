"""Third-party task suites as environments: GEM and reasoning-gym."""
