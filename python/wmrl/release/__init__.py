"""Release artefacts: model pairs (two world models + reward model + initial observations)."""
