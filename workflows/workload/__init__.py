"""One child workload on an execution substrate: its record, its task, its observations."""
