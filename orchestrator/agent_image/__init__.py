"""The agent image: building it, the tools it must hold, the pinned agent CLIs,
and the project's environment image built on it."""
