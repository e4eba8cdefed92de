"""Model backends behind one template (DESIGN §7); each provider module imports its SDK lazily."""
