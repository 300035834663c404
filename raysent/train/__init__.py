"""Training: the one-worker loop (raysent.train.loop) and its Ray Train wrapper (raysent.train.ray_train)."""
