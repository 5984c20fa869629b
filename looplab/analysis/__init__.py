"""Analysis of trained looped models: latent trajectories and their geometry."""
