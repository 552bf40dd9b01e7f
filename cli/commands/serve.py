"""`snapcache serve [MODEL]`: an OpenAI-compatible local server whose prompts survive restarts."""

from __future__ import annotations

import errno
import os
import re
import socket
from typing import Annotated

import typer

from ..command_errors import CliError
from ..formatting import parse_size
from ..model_source import choose_model, load_llama, quiet_llama_cpp
from ..remote import API_KEY_ENV
from ..settings import settings_of
from .warm import ExactOption, InexactOption, ThreadsOption, exactness

# The server's own defaults, repeated here so that `serve --help` works without the server extra.
DEFAULT_MAX_TOKENS = 1024
DEFAULT_PARALLEL = 4
BATCH_MODES = ("batched", "exact")
_NO_SERVER = (
    "snapcache serve needs llama-cpp-python's server packages: pip install 'snapcache[server]' ({missing})"
)


def serve(
    ctx: typer.Context,
    model: Annotated[
        str | None,
        typer.Argument(
            metavar="[MODEL]",
            help="A GGUF model file (default: $SNAPCACHE_MODEL, else the demo model).",
            show_default=False,
        ),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.", min=1, max=65535)] = 8000,
    n_ctx: Annotated[
        int | None,
        typer.Option(
            "--n-ctx",
            min=1,
            help="Context size in tokens of each request, prompt and answer (default 32768, room for "
            "the 20-25K-token prompts of Claude Code or Codex, or the model's trained context if smaller). "
            "With --parallel N the KV cache holds N+1 such contexts: one per sequence and the model's "
            "own (warms, and requests the batched path cannot do). KV memory is N+1 times n_ctx times the "
            "model's bytes per token (Gemma-3-270M: the server holds 3.2 GiB at the defaults, 1.0 GiB "
            "with --parallel 1, 0.8 GiB with --n-ctx 4096; an 8B model with 128 KiB per token: 4 GiB "
            "per 32768-token context, 20 GiB with --parallel 4). Lower --parallel or --n-ctx, or set "
            "--seq-ctx, to hold less.",
            show_default=False,
        ),
    ] = None,
    threads: ThreadsOption = None,
    parallel: Annotated[
        int,
        typer.Option(
            "--parallel",
            "-np",
            min=1,
            max=256,
            help="Requests answered at once on the one loaded model, batched together "
            "(1: one at a time). Memory for the KV cache grows N times (see --n-ctx).",
        ),
    ] = DEFAULT_PARALLEL,
    seq_ctx: Annotated[
        int | None,
        typer.Option(
            "--seq-ctx",
            min=16,
            help="With --parallel above 1: tokens each sequence holds, prompt and answer (default and "
            "most: --n-ctx). Smaller keeps the KV cache down; a request that may need more runs on the "
            "model's own context, one at a time.",
            show_default=False,
        ),
    ] = None,
    batch_mode: Annotated[
        str,
        typer.Option(
            "--batch-mode",
            help="With --parallel above 1: 'batched' decodes the requests' next tokens together "
            "(throughput; answers of requests that share steps may differ slightly from a request "
            "run alone), 'exact' one request per decode (every answer as if run alone).",
        ),
    ] = "batched",
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            help=f"Require this bearer token from clients (default: ${API_KEY_ENV}, else none).",
            show_default=False,
        ),
    ] = None,
    ram: Annotated[str, typer.Option("--ram", help="RAM budget of the cache (e.g. 512M, 2G).")] = "512M",
    disk: Annotated[
        str | None,
        typer.Option(
            "--disk", help="Disk budget of the cache (default: the directory's, else 8G).", show_default=False
        ),
    ] = None,
    priority: Annotated[int, typer.Option("--priority", "-p", help="Priority of the states it saves.")] = 0,
    model_alias: Annotated[
        str | None,
        typer.Option(
            "--model-alias", help="The model's id in /v1/models (default: the file name).", show_default=False
        ),
    ] = None,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option("--cors-origin", help="A browser origin allowed to call the server (repeatable)."),
    ] = None,
    exact: ExactOption = False,
    inexact: InexactOption = False,
    keep_billing_header: Annotated[
        bool,
        typer.Option(
            "--keep-billing-header",
            help="Keep Claude Code's first system block (x-anthropic-billing-header: cc_version=...;) in "
            "prompts. By default it is dropped: its values change every session, and every token after "
            "it would miss the cache.",
        ),
    ] = False,
    normalize: Annotated[
        list[str] | None,
        typer.Option(
            "--normalize",
            metavar="REGEX",
            help="Delete text matching this regular expression from every request's messages before "
            "rendering (repeatable), e.g. a date line that changes daily: '^Today is .*$'. "
            "/snapcache/why says which rules changed a scope's last request.",
        ),
    ] = None,
    live_tool_calls: Annotated[
        bool,
        typer.Option(
            "--live-tool-calls",
            help="Stream a tool call as the model writes it: its name first, then its arguments in "
            "pieces, as the hosted APIs do; a call then cut by max_tokens stays a partial call. By "
            "default a call is sent once it is whole, and a call cut short comes back as text.",
        ),
    ] = False,
    mmproj: Annotated[
        str | None,
        typer.Option(
            "--mmproj",
            metavar="FILE",
            help="The model's projector (an mmproj GGUF): chats may then hold images, in every API, sent "
            "as bytes (a data URL or base64). An image is cached by its pixels: the same screenshot in a "
            "later request, or after a restart, is not read again.",
            show_default=False,
        ),
    ] = None,
    max_tokens_default: Annotated[
        int,
        typer.Option(
            "--max-tokens-default",
            min=0,
            help="Tokens a completion may generate when its request sets no max_tokens or "
            "max_completion_tokens (0: until the context is full).",
        ),
    ] = DEFAULT_MAX_TOKENS,
) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API, restoring cached prompts before each completion."""
    try:
        from snapcache.server import ServeOptions, create_app, serve_context_size
        from snapcache.server import serve as run_server
    except ImportError as exc:
        raise CliError(_NO_SERVER.format(missing=f"missing: {exc.name}")) from None
    from snapcache import SnapshotStore

    for pattern in normalize or ():
        try:
            re.compile(pattern)
        except re.error as exc:
            raise CliError(f"--normalize {pattern!r} is not a regular expression: {exc}") from None
    if batch_mode not in BATCH_MODES:
        raise CliError(f"--batch-mode must be one of {', '.join(BATCH_MODES)}, got {batch_mode!r}")
    choice = choose_model(model)
    if mmproj is not None and not os.path.isfile(mmproj):
        raise CliError(f"--mmproj {mmproj}: no such file")
    ram_bytes = _size(ram, "--ram")
    disk_bytes = _size(disk, "--disk") if disk is not None else None
    _check_port_free(host, port)
    settings = settings_of(ctx)
    directory = settings.cache_dir
    tiers = settings.store_options()
    store = (
        SnapshotStore(ram_bytes=ram_bytes, disk_bytes=disk_bytes, **tiers)
        if directory is None
        else SnapshotStore(directory, ram_bytes=ram_bytes, disk_bytes=disk_bytes, **tiers)
    )
    with store:
        if n_ctx is None:
            quiet_llama_cpp()
            n_ctx = serve_context_size(choice.path)
        llm = load_llama(
            choice, n_ctx=n_ctx, threads=threads, verbose=settings.verbose, **settings.llama_options()
        )
        try:
            options = ServeOptions(
                api_key=api_key or os.environ.get(API_KEY_ENV) or None,
                model_alias=model_alias,
                cors_origins=tuple(cors_origin or ()),
                priority=priority,
                exact=exactness(exact, inexact),
                max_tokens_default=max_tokens_default or None,
                parallel=parallel,
                batch_mode="exact" if batch_mode == "exact" else "batched",
                seq_ctx=seq_ctx,
                keep_billing_header=keep_billing_header,
                normalize=tuple(normalize or ()),
                live_tool_calls=live_tool_calls,
                mmproj=mmproj,
            )
            app = create_app(llm, store, options)
            where = store.directory if store.directory is not None else "RAM only"
            typer.echo(
                f"snapcache serve: {choice.path.name} on http://{_url_host(host)}:{port}/v1 "
                f"(cache: {where}); Ctrl-C to stop",
                err=True,
            )
            run_server(app, host=host, port=port)
        finally:
            llm.close()


def _size(text: str, option: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise CliError(f"{option}: {exc}") from None


def _check_port_free(host: str, port: int) -> None:
    """CliError, before the model loads, when nothing could listen on host:port."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CliError(f"cannot listen on {host}: {exc.strerror or exc}") from None
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise CliError(f"port {port} on {host} is already in use; pick another with --port") from None
            raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
