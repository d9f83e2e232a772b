"""The Ray launcher `hydra/launcher=ray` (`ray_launcher.RayLauncher`, over hydra-ray-launcher)."""
