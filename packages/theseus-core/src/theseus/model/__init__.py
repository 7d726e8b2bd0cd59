"""Language models and their components (Flax linen)."""
