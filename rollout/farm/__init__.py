"""The env farm: `core` (EnvFarm, its local and Ray backends, MixFarm, FarmConfig, make_farm), the worker side
(`worker`: EnvHost, EnvWorker), the direct driver <-> worker byte channel (`channel`) and the farm's metrics
(`metrics`)."""
