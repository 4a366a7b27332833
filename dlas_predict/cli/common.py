"""What every command shares: the application and its groups, the error handler that turns a
library error into one ``Error: …`` line and a non-zero exit, the options of the measuring
commands (RPC, tuning, timing) and the objects made from them."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Callable, Optional

import typer
from typer.core import TyperGroup

from dlas_predict.errors import DlasError, with_flags


class OncePerOption(TyperGroup):
    """A group whose commands refuse an option of one value given more than once (the
    parser would keep the last and drop the others without a word)."""

    def resolve_command(self, ctx, args: list[str]):
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None and not hasattr(cmd, "commands"):  # a command, not a group
            repeated_option(cmd, rest, ctx)
        return name, cmd, rest


def repeated_option(cmd, args: list[str], ctx) -> None:
    """A usage error where ``args`` give one of ``cmd``'s single-valued options twice."""
    for p in cmd.params:
        if getattr(p, "param_type_name", "") != "option" or p.multiple or p.count \
                or p.is_flag:
            continue
        names = [*p.opts, *p.secondary_opts]
        given = 0
        for a in args:
            if a == "--":
                break
            given += any(a == o or (o.startswith("--") and a.startswith(o + "="))
                         for o in names)
        if given > 1:
            raise typer.BadParameter(f"given {given} times; it takes one value", ctx=ctx,
                                     param=p)


#: Help texts are plain text: ``[/ALGORITHM]`` and the like are syntax, not rich markup;
#: every group refuses a single-valued option given twice (:class:`OncePerOption`).
PLAIN = {"rich_markup_mode": None, "cls": OncePerOption}

app = typer.Typer(add_completion=False, no_args_is_help=True, **PLAIN,
                  help="Predict the fastest accurate way to deploy a DNN (DLAS grid), "
                       "from real TVM measurements.")
corpus_app = typer.Typer(no_args_is_help=True, **PLAIN, help="Inspect and export a measurement corpus.")
app.add_typer(corpus_app, name="corpus")
analyze_app = typer.Typer(no_args_is_help=True, **PLAIN, help="ParaDnn's analysis toolbox over a corpus: "
                          "heatmap, regression, roofline, boxplot (PNG/SVG/PDF plots).")
app.add_typer(analyze_app, name="analyze")


def fail(message: str, code: int = 1) -> None:
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(code)


def handle_errors(func: Callable) -> Callable:
    """Turn library errors into one ``Error:`` line and a non-zero exit status, each
    parameter the message names shown as the command's option that sets it; under
    ``--json`` the error is also printed as JSON (``{"error": ...}``) on stdout."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        def failed(message: str, code: int = 1) -> None:
            if kwargs.get("as_json"):
                typer.echo(json.dumps({"error": message}))
            fail(message, code)

        try:
            return func(*args, **kwargs)
        except DlasError as exc:
            failed(with_flags(str(exc), command_flags(func)))
        except BrokenPipeError:  # the reader went away (`| head`): stop as a Unix tool does
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(141)  # 128 + SIGPIPE
        except OSError as exc:  # unwritable output, full disk, unreadable input
            failed(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))
        except KeyboardInterrupt:
            failed("interrupted; every record measured so far is kept in the store", 130)

    return wrapper


#: Library parameters that a command's option sets under another name.
PARAM_ALIASES = {"limit": "data_limit", "request_timeout_s": "timeout", "patience": "early_stop",
                 "budget": "trials",
                 "finetune_epochs": "fine_tune", "key": "rpc_key",
                 "allow_remote": "allow_remote_tracker"}


def command_flags(func: Callable) -> dict[str, str]:
    """A command's options by the library parameters they set: each option's own name
    (its longest flag), and its :data:`PARAM_ALIASES`."""
    import inspect

    from typer.models import OptionInfo

    flags = {}
    for name, p in inspect.signature(func).parameters.items():
        if isinstance(p.default, OptionInfo):
            decls = [d.split("/")[0] for d in p.default.param_decls if d.startswith("--")]
            if decls:
                flags[name] = max(decls, key=len)
    flags.update({k: flags[v] for k, v in PARAM_ALIASES.items() if v in flags and k not in flags})
    return flags


def print_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


TRACKER_OPT = typer.Option(None, "--tracker", help="Measure on boards of this TVM RPC "
                            "tracker (HOST:PORT; default $DLAS_TRACKER). Loopback only "
                            "unless --allow-remote-tracker.")
RPC_KEY_OPT = typer.Option(None, "--rpc-key", help="Tracker key of the boards (default: the "
                            "device's rpc_key in the registry).")
ALLOW_REMOTE_OPT = typer.Option(False, "--allow-remote-tracker", help="Allow a tracker that "
                                 "is not on loopback. TVM RPC has no authentication: anyone "
                                 "on that network can run code on the boards.")
BOARDS_OPT = typer.Option(None, "--boards", help="RPC: boards to use at once (default: "
                           "every board under the key).")
TRIES_OPT = typer.Option(3, "--tries", help="RPC: boards a task is given (after a board "
                          "drops off, crashes or hangs) before its failure is recorded.")


# ---- measure ----------------------------------------------------------------------------
TRIALS_OPT = typer.Option(64, "--trials", help="Tuned: trial budget per kernel (up to the "
                           "study's 20000).")
EARLY_STOP_OPT = typer.Option(32, "--early-stop", help="Tuned: stop a search after this many "
                               "trials without a 1 % gain (0: never).")
TUNING_DB_OPT = typer.Option(None, "--tuning-db", help="Tuning database directory, reused "
                              "across runs (default: DLAS_HOME/tuning/DEVICE-FINGERPRINT).")

QUIET_WAIT_OPT = typer.Option(30.0, "--quiet-wait", help="Seconds to wait, before each "
                               "timing, for the machine to run at its usual speed: no other "
                               "process on a core, the canary kernel near its fastest (0: time "
                               "at once; both are probed and recorded either way).")

DATA_LIMIT_OPT = typer.Option(None, "--data-limit", help="Measure on at most this many images "
                              "of --data (the same seeded subset every run).")
MEAN_OPT = typer.Option(None, "--mean", help="Per-channel mean of the input normalisation, on "
                        "the 0-1 scale (e.g. 0.485,0.456,0.406; default: the model's metadata, "
                        "else 0.5).")
STD_OPT = typer.Option(None, "--std", help="Per-channel std of the input normalisation (default: "
                       "the model's metadata, else 0.5).")
INPUT_SIZE_OPT = typer.Option(None, "--input-size", help="HxW (or N) of a model whose input "
                              "leaves them open.")


SHAPE_OPT = typer.Option(None, "--shape", help="The input's shape (e.g. 1x128x256) where "
                         "the model leaves sizes open (a sequence length, say).")


def shaped(model: str, shape: str | None) -> str:
    """``model``, or with ``--shape`` given, its copy whose input has that shape."""
    if shape is None:
        return model
    from dlas_predict.networks import zoo
    from dlas_predict.networks.graph import with_input_shape

    if str(model).startswith(zoo.ZOO_PREFIX):
        raise DlasError(f"--shape is for an ONNX file whose input leaves sizes open; {model} "
                        "has its own")
    try:
        dims = tuple(int(x) for x in shape.replace("×", "x").replace(",", "x").split("x"))
    except ValueError:
        raise DlasError(f"--shape takes sizes like 1x128x256, got {shape!r}") from None
    return str(with_input_shape(model, dims))


def data_options(limit, mean, std, input_size):
    """The data options of the flags above."""
    from dlas_predict.compression.data import DataOptions, parse_floats, parse_size

    return DataOptions(limit, parse_floats(mean, "--mean"), parse_floats(std, "--std"),
                       parse_size(input_size))


def check_quiet_wait(quiet_wait: float) -> None:
    from dlas_predict.errors import ConfigError

    if quiet_wait < 0:
        raise ConfigError(f"--quiet-wait must be 0 or more seconds, got {quiet_wait}")


def make_protocol(max_repeats: int, time_budget: float, quiet_wait: float = 30.0):
    from dlas_predict.errors import ConfigError
    from dlas_predict.measure.execution.tasks import Protocol

    if max_repeats < 1:
        raise ConfigError(f"--max-repeats must be at least 1, got {max_repeats}")
    if time_budget <= 0:
        raise ConfigError(f"--time-budget must be positive, got {time_budget}")
    check_quiet_wait(quiet_wait)
    return Protocol(max_repeats=max_repeats, min_repeats=min(10, max_repeats),
                    time_budget_s=time_budget, quiet_wait_s=quiet_wait)


def make_rpc(device, tracker, rpc_key, allow_remote, boards=None, tries=3, timeout=300.0,
         emulated=False):
    """The RPC options of a measuring command (None: measure on this machine); an
    unreachable tracker or an unknown key fails here, with one clear line."""
    from dlas_predict.measure.execution.remote import boards_under
    from dlas_predict.measure.execution.rpcopts import rpc_options

    rpc = rpc_options(tracker, rpc_key, device, allow_remote,
                      warn=lambda line: typer.echo(line, err=True), boards=boards,
                      tries=tries, request_timeout_s=timeout, emulated=emulated)
    if rpc is not None:
        boards_under(rpc.host, rpc.port, rpc.key)
    return rpc


def print_board_progress(runner) -> None:
    """Per-board progress of a farm run."""
    progress = getattr(runner, "progress", None)
    for p in (progress() if progress else []):
        typer.echo(f"board {p['board']}: {p['done']} measured ({p['failed']} failed), "
                   f"{p['requeued']} given back after the board dropped off, crashed or hung; "
                   f"busy {p['busy_s']:.1f} s", err=True)


def make_tuning(tuning: str, trials: int, early_stop: int, tuning_db: Optional[Path]):
    """(tunings to measure, tuning options) from the command's options."""
    from dlas_predict.space.config import Tuning
    from dlas_predict.measure.execution.runner import TuningOptions

    tunings = Tuning.parse_list(tuning)
    return tunings, TuningOptions(budget=trials, patience=early_stop,
                                  db=str(tuning_db) if tuning_db else None)


def parse_backends(text: str) -> tuple[str, ...]:
    """``tvm``, ``onnxruntime`` or both, from a comma list."""
    allowed = ("tvm", "onnxruntime")
    got = [b.strip().lower() for b in str(text).split(",") if b.strip()]
    bad = [b for b in got if b not in allowed]
    if bad or not got:
        raise DlasError(f"unknown backend {(bad or [text])[0]!r}; backends: "
                        + ", ".join(allowed))
    return tuple(b for b in allowed if b in got)


def open_network_runner(device: str, rpc=None, quiet_wait: float = 30.0):
    """A factory of the whole-network runner that validates on ``device``: this machine
    (or its profile), or the boards of ``rpc``, waiting up to ``quiet_wait`` s for quiet."""
    from dlas_predict.space.devices import get_device

    dev = get_device(device, with_target=False)
    if rpc is None and not dev.measured_here:
        return None  # recommend refuses to validate elsewhere, with the reason

    def make():
        from dlas_predict.measure.execution.farm import network_runner
        from dlas_predict.measure.execution.tasks import Protocol

        log = lambda line: typer.echo(line, err=True)  # noqa: E731
        return network_runner(get_device(device), Protocol(quiet_wait_s=quiet_wait), 600.0,
                              rpc, log)

    return make
