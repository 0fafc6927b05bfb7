"""Jobs of many rollouts: job files, the runner, executors (asyncio, Ray), branch trees."""
