"""The planner: model shapes, memory and speed models, the offload/batch search, and tuning on this machine."""
