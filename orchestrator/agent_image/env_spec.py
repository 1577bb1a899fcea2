"""The records the configuration and a devcontainer are read into, apart from their readers
(``devcontainer``, ``environment``) so that each can build them without importing the other."""

from __future__ import annotations

import shlex

import msgspec


class SetupCommand(msgspec.Struct, frozen=True):
    """One setup step: a shell line, or an argv run without a shell (a devcontainer array)."""

    label: str
    shell: str | None = None
    argv: tuple[str, ...] | None = None

    @property
    def stage(self) -> str:
        """The lifecycle command it belongs to (``postCreateCommand`` for ``postCreateCommand.deps``)."""
        return self.label.split(".", 1)[0].split(" ", 1)[0]

    def exec_argv(self) -> list[str]:
        return list(self.argv) if self.argv is not None else ["/bin/sh", "-c", self.shell or ""]

    def display(self) -> str:
        return self.shell if self.shell is not None else shlex.join(self.argv or ())


class EnvironmentSpec(msgspec.Struct, frozen=True):
    """What a run's environment is made of, read from the configuration or a devcontainer.

    Values hold no variable of the host any more (``${localEnv:...}`` and the
    workspace folders are resolved when the file is read); ``${containerEnv:...}``
    stays until the image is known, since only the image can answer it.
    """

    source: str
    image: str | None = None
    dockerfile: str | None = None  # repository path, at the base commit
    context: str = ""  # repository directory, "" for the root
    build_args: dict[str, str] = msgspec.field(default_factory=dict)
    target: str | None = None
    container_env: dict[str, str] = msgspec.field(default_factory=dict)
    # None: the devcontainer unsets the variable ("remoteEnv": {"X": null})
    remote_env: dict[str, str | None] = msgspec.field(default_factory=dict)
    remote_user: str | None = None
    container_user: str | None = None
    setup: tuple[SetupCommand, ...] = ()
    notes: tuple[str, ...] = ()
    # A devcontainer's: the image's own devcontainer.metadata label is merged
    # in, and the setup runs as the devcontainer's user, as VS Code does. The
    # configuration's environment keeps the simpler contract (setup as root).
    devcontainer: bool = False
