"""The run's record: the event log, its event types, the state folded from it, and the run folders."""
