"""docker_exec's stream reading: its end, its errors, and the docker-py internals it relies on."""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from orchestrator.runner.docker_exec import StreamBroken, _read_frame

ROOT = Path(__file__).resolve().parent.parent


def _frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


def test_frames_then_a_clean_end():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(_frame(1, b"hello\n") + _frame(2, b"oops\n"))
        a.close()
        assert _read_frame(b) == (1, b"hello\n")
        assert _read_frame(b) == (2, b"oops\n")
        assert _read_frame(b) is None


def test_a_frame_cut_short_is_an_error_not_the_end_of_the_output():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack(">BxxxL", 1, 100) + b"only ten b")
        a.close()
        with pytest.raises(StreamBroken):
            _read_frame(b)


def test_a_socket_error_is_an_error_not_the_end_of_the_output():
    a, b = socket.socketpair()
    a.close()
    b.close()  # reading a closed socket: OSError (EBADF)
    with pytest.raises(StreamBroken):
        _read_frame(b)


def test_docker_py_is_pinned_below_the_next_major_and_its_internals_are_there():
    """docker_exec uses docker-py internals; the pin keeps them, and this test notices when they go."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if re.match(r"docker\b", d))
    upper = re.search(r"<\s*(\d+)", spec)
    assert upper, f"docker must have an upper bound in pyproject.toml: {spec}"
    assert int(version("docker").split(".")[0]) < int(upper.group(1))
    from docker.api.client import APIClient
    from docker.utils import socket as dsocket

    assert callable(dsocket.read_exactly) and dsocket.SocketError
    assert callable(APIClient._disable_socket_timeout)


def _split_stderr(frames: list[bytes]) -> tuple[bytes, bytes | None]:
    """Feed stderr frames through _take_end_line as run_exec does: (the task's stderr, the end line's value)."""
    from orchestrator.runner.docker_exec import _take_end_line

    held, agent, value = b"", b"", None
    for data in frames:
        data, held, end = _take_end_line(held + data)
        agent += data
        value = end if end is not None else value
    return agent + held, value


@pytest.mark.parametrize(
    "agent",
    [
        b"",
        b"plain\n",
        b"no newline",
        b"\n\n",
        b"looks like \n@@orchestrator-e",
        b"\n@@orchestrator-end=",
        b"x\n@@orchestrator-end=12 not it\n",
        b"x\n@@orchestrator-end=- not it\n",
    ],
)
@pytest.mark.parametrize("value", [b"37", b"-"])
def test_the_wrappers_end_line_comes_out_of_stderr_wherever_the_frames_cut_it(agent, value):
    """However the daemon's reads cut the stream, the task's stderr is what it wrote and the end line is found."""
    stream = agent + b"\n@@orchestrator-end=" + value + b"\n"
    for cut in range(len(stream) + 1):
        for cut2 in range(cut, len(stream) + 1):
            assert _split_stderr([stream[:cut], stream[cut:cut2], stream[cut2:]]) == (agent, value), (cut, cut2)
    assert _split_stderr([agent[:3], agent[3:]]) == (agent, None)


@pytest.fixture
def sleeping_container(run_id):
    """A container of the test image that sleeps, removed with the run's (the run_id fixture)."""
    import subprocess

    from conftest import TEST_IMAGE

    name = f"orchestrator_{run_id}_sleeping"
    subprocess.run(
        [
            "docker",
            "run",
            "-d",
            "--name",
            name,
            "--label",
            f"run_id={run_id}",
            "--entrypoint",
            "sleep",
            TEST_IMAGE,
            "300",
        ],
        check=True,
        capture_output=True,
    )
    return name


@pytest.mark.docker
async def test_a_cancelled_exec_whose_process_cannot_be_ended_still_ends_as_a_cancellation(sleeping_container, caplog):
    """Ctrl+C or a timeout reaches an exec; ``on_cancel``, asked to end its process,
    fails. The caller's cancellation must still be what comes out (a Ctrl+C stays
    a Ctrl+C, a timeout a timeout), at once, with the failure in the runner's log;
    it used to come out as an ExceptionGroup of the failure instead."""
    import logging
    import time

    import anyio

    from orchestrator.runner.docker_containers import DockerHost
    from orchestrator.runner.docker_exec import run_exec
    from orchestrator.runner.registry import get_plugin

    async def failing_on_cancel():
        raise RuntimeError("the engine went away")

    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="orchestrator.runner"), anyio.move_on_after(2) as scope:
        await run_exec(
            DockerHost(),
            sleeping_container,
            ["sh", "-c", "echo started; sleep 60"],
            env={},
            parser=get_plugin("command").new_parser(),
            stdin_payload=None,
            on_event=lambda event: None,
            on_cancel=failing_on_cancel,
        )
    assert scope.cancelled_caught
    assert time.monotonic() - started < 10
    failures = [r for r in caplog.records if "could not end" in r.getMessage()]
    assert failures and "the engine went away" in failures[0].getMessage()


def test_output_already_read_off_the_socket_comes_first():
    a, b = socket.socketpair()
    with a, b:
        frames = _frame(1, b"line1\n") + _frame(1, b"line2\n")
        pending = bytearray(frames[:11])  # a whole frame and the start of the next
        a.sendall(frames[11:])
        a.close()
        assert _read_frame(b, pending) == (1, b"line1\n")
        assert _read_frame(b, pending) == (1, b"line2\n")
        assert _read_frame(b, pending) is None and not pending


@pytest.fixture
def coalescing_engine(tmp_path):
    """The machine's engine behind a unix socket that holds each answer's first bytes
    until more have come: the headers of an exec's start and its first output then
    arrive together, as they do when a loaded machine reads the answer late."""
    import threading
    import time

    path = str(tmp_path / "engine.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(16)

    def pump(src: socket.socket, dst: socket.socket, hold: bool) -> None:
        try:
            while data := src.recv(65536):
                if hold:
                    hold = False
                    time.sleep(0.3)
                    src.setblocking(False)
                    with contextlib.suppress(BlockingIOError):
                        while more := src.recv(65536):
                            data += more
                    src.setblocking(True)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = server.accept()
                engine = socket.socket(socket.AF_UNIX)
                engine.connect("/var/run/docker.sock")
                threading.Thread(target=pump, args=(client, engine, False), daemon=True).start()
                threading.Thread(target=pump, args=(engine, client, True), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield f"unix://{path}"
    server.close()


@pytest.mark.docker
async def test_output_that_arrives_with_the_exec_start_answer_is_not_lost(sleeping_container, coalescing_engine):
    """Seen in a six-worker run: a command task's first three lines were missing from its output."""
    import docker

    from orchestrator.runner.docker_containers import DockerHost
    from orchestrator.runner.docker_exec import run_exec
    from orchestrator.runner.registry import get_plugin

    host = DockerHost(lambda: docker.DockerClient(base_url=coalescing_engine))
    for _ in range(3):
        parser = get_plugin("command").new_parser()
        await run_exec(
            host,
            sleeping_container,
            ["sh", "-c", "echo line1; echo line2; echo line3"],
            env={},
            parser=parser,
            stdin_payload=None,
            on_event=lambda event: None,
        )
        assert parser.finish(0).final_message == "line1\nline2\nline3\n"


@pytest.mark.parametrize(
    ("raw", "plain"),
    [
        ("\x1b[32m++hello \x1b[2m[string]\x1b[0m", "++hello [string]"),  # npm test's colours
        ("\x1b[?25l\x1b[2K\x1b[1Gdone", "done"),  # cursor hidden, line erased, column 1
        ("\x1b]0;title\x07text", "text"),  # a window title
        ("\x1b]8;;https://example.com\x1b\\link\x1b]8;;\x1b\\ end", "link end"),  # a hyperlink keeps its text
        ("a\x1b(Bb", "ab"),
        ("\x9b31mred", "red"),  # CSI as one C1 character
        ("cut off\x1b[", "cut off"),
        ("ě [0m stays: text, not a code", "ě [0m stays: text, not a code"),
    ],
)
def test_terminal_codes_come_out_and_the_text_stays(raw, plain):
    from orchestrator.sanitize import plain_bytes, plain_text

    assert plain_text(raw) == plain
    if "\x9b" not in raw:  # in bytes 0x9b is part of a UTF-8 character, never a code
        assert plain_bytes(raw.encode()) == plain.encode()
    assert plain_bytes("\x1b[1mě\x1b[0m".encode()) == "ě".encode()


@pytest.mark.docker
async def test_a_commands_colours_are_taken_out_where_its_output_arrives(sleeping_container):
    """The issue's case: a test command's colours reached the report raw ("[32m++hello [2m[string]")."""
    from orchestrator.runner.docker_containers import DockerHost
    from orchestrator.runner.docker_exec import run_exec
    from orchestrator.runner.registry import get_plugin

    # Each code cut in two by a pause, so the engine sends it in two frames.
    script = (
        r"printf '\033[3'; sleep 0.2; printf '2m++hello \033[2m[string]\033[0m\n';"
        r"{ printf '\033[31mFAIL\033'; sleep 0.2; printf '[0m\n'; } >&2; exit 1"
    )
    out = await run_exec(
        DockerHost(),
        sleeping_container,
        ["sh", "-c", script],
        env={},
        parser=get_plugin("command").new_parser(),
        stdin_payload=None,
        on_event=lambda event: None,
    )
    assert out.exit_code == 1
    assert out.outcome.final_message == "++hello [string]\n"
    assert out.outcome.error_message == "command exited with status 1: FAIL"
    assert out.stdout_tail == b"++hello [string]\n" and out.stderr_tail == b"FAIL\n"
