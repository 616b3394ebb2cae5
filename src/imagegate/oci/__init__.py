"""Where images come from (registries, the engine, archives, OCI layouts) and how their bytes are verified."""
