"""One grammar for every command: Hydra overrides against a structured config.

Each command declares a dataclass (its keys, their types and defaults, one ``:param`` line of help
each) and registers it with Hydra's ConfigStore under the command's name. The command line is
composed by Hydra (``key=value``, ``group=option``, ``+key=value``) and checked twice: by Hydra
against the schema's types (unknown keys and wrong types are rejected), then by the schema's own
``check``. Every failure is one :class:`ConfigError` line naming the key. ``-m`` runs the
cartesian product of comma-separated values, one job after another, each in its own folder.
"""

from __future__ import annotations

import dataclasses
import difflib
import errno
import itertools
import logging
import math
import os
import re
import textwrap
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ncclrl.costmodel.errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

# Hydra and OmegaConf are imported by the functions that compose a config, not by this module: the
# command list (``ncclrl --help``) and ``ncclrl --version`` need neither

log = logging.getLogger(__name__)

# Python logging through Hydra's job logging: messages to stderr, so stdout carries only results
JOB_LOGGING = {
    "version": 1,
    "formatters": {"plain": {"format": "%(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stderr"}},
    "root": {"level": "INFO", "handlers": ["console"]},
    "disable_existing_loggers": False,
}


@dataclass
class Command:
    """A command of the ``ncclrl`` program.

    :param name: what the user types (``sweep``, ``plugin verify``)
    :param schema: the dataclass of its keys
    :param run: called with the composed, checked config; returns the exit code (or None for 0)
    :param summary: one line for ``ncclrl --help``
    :param positional: the key that bare words fill (``ncclrl show TABLE``); a list key takes several
    :param out_key: the key naming the output folder, which ``-m`` gives each job its own of
    :param required: the keys whose default is empty and that the command refuses empty (``--help``
        marks them)
    :param example: one command line ``--help`` shows
    """

    name: str
    schema: type
    run: Callable[[DictConfig], int | None]
    summary: str
    positional: str | None = None
    out_key: str | None = None
    required: tuple[str, ...] = ()
    example: str = ""


def _config_name(name: str) -> str:
    return "cmd_" + name.replace(" ", "_")


def register(cmd: Command) -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=_config_name(cmd.name), node=cmd.schema)


# -- help ---------------------------------------------------------------------------------------


def param_docs(cls: type) -> dict[str, str]:
    """The first line of each ``:param name: ...`` of a dataclass and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for m in re.finditer(r":param (\w+): (.+?)(?=\n\s*:param |\n\s*\n|\Z)", klass.__doc__ or "", re.S):
            docs[m.group(1)] = " ".join(m.group(2).split())
    return docs


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        return "list"
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _type_name(args[0]) if args else "any"
    return getattr(tp, "__name__", str(tp))


def help_rows(cls: type, default: Any, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) of every key of ``cls``, nested dataclasses flattened."""
    from omegaconf import OmegaConf

    rows = []
    docs = param_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name == "defaults":
            continue
        tp = hints[f.name]
        value = default[f.name] if default is not None and f.name in default else None
        if dataclasses.is_dataclass(tp):
            rows.append((prefix + f.name, "group", "", docs.get(f.name, "")))
            rows += help_rows(tp, value, prefix + f.name + ".")
            continue
        shown = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        shown = "null" if shown is None else ("[" + ",".join(map(str, shown)) + "]" if isinstance(shown, list)
                                              else str(shown).lower() if isinstance(shown, bool) else str(shown))
        rows.append((prefix + f.name, _type_name(tp), shown, docs.get(f.name, "")))
    return rows


def command_help(cmd: Command) -> str:
    cfg = compose_config(cmd, [], check=False)
    required = set(cmd.required)
    pos = ""
    if cmd.positional:
        word = cmd.positional.upper() + ("..." if _type_name(_keys(cmd.schema)[cmd.positional]) == "list" else "")
        pos = f" {word}" if cmd.positional in required else f" [{word}]"
    pos += "".join(f" {k}={k.rsplit('.', 1)[-1].upper()}" for k in cmd.required if k != cmd.positional)
    lines = [f"usage: ncclrl {cmd.name}{pos} [key=value ...] [-m]", "", cmd.summary, ""]
    if cmd.example:
        lines += [f"example: {cmd.example}", ""]
    doc = (cmd.schema.__doc__ or "").split(":param", 1)[0].strip()
    if doc:
        lines += [textwrap_block(doc), ""]
    if cmd.positional:
        lines += [f"Bare words fill {cmd.positional}= (ncclrl {cmd.name} X is ncclrl {cmd.name} {cmd.positional}=X).",
                  ""]
    groups = [g for g in _groups(cmd.schema)]
    if groups:
        lines.append("config groups (group=option):")
        for g, opts in groups:
            lines.append(f"  {g:<28} {'|'.join(opts)}")
        lines.append("")
    lines.append("keys (key=value; sizes as 8, 64K, 1M, 4G):")
    for key, tp, default, text in help_rows(cmd.schema, cfg):
        if tp == "group":
            continue
        if key in required:
            text = f"(required) {text}"
        lines.append(f"  {key + '=' + default:<36} {text}" if len(key + default) < 35 else
                     f"  {key}={default}\n  {'':<36} {text}")
    lines += ["", "-m runs every combination of comma-separated values (key=a,b), one job after another; --cfg job "
              "prints the composed config (YAML) and runs nothing.",
              "A key not listed is refused (with or without +); of Hydra's own settings hydra.verbose=true (debug "
              "logging) is read."]
    return "\n".join(lines)


def textwrap_block(text: str) -> str:
    return "\n".join(textwrap.fill(" ".join(p.split()), 100) for p in text.split("\n\n"))


def _groups(schema: type) -> list[tuple[str, list[str]]]:
    root = files("ncclrl.conf")
    out = []
    for f in dataclasses.fields(schema):
        if f.name != "defaults":
            continue
        for entry in f.default_factory():  # type: ignore[misc]
            if isinstance(entry, dict):
                (g,) = entry
                out.append((g, sorted(p.name[:-5] for p in root.joinpath(g).iterdir() if p.name.endswith(".yaml"))))
    return out


# -- composing ----------------------------------------------------------------------------------


def _keys(schema: type, prefix: str = "") -> dict[str, type]:
    out: dict[str, type] = {}
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if f.name == "defaults":
            continue
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out[prefix + f.name] = tp
            out.update(_keys(tp, prefix + f.name + "."))
        else:
            out[prefix + f.name] = tp
    return out


def _clean(message: str) -> str:
    text = " ".join(message.split())
    text = re.sub(r"\s*full_key: \S+.*$", "", text)
    return re.sub(r"\s*(object_type|reference_type)=\S+", "", text)


def compose_config(cmd: Command, overrides: list[str], check: bool = True, setup_logging: bool = False) -> DictConfig:
    """The command's config with ``overrides`` applied and checked (``check``); a bad override is
    one ``ConfigError`` line. ``setup_logging``: configure Python logging from Hydra's job logging
    (what the command line does; a library caller keeps its own)."""
    from hydra import compose, initialize_config_module
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import configure_log
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    keys = _keys(cmd.schema)
    groups = dict(_groups(cmd.schema))
    parsed = parse_overrides(overrides)
    for o in parsed:
        key = o.key_or_group
        if o.is_sweep_override():
            raise ConfigError(key, f"{o.input_line!r} is several values: run with -m to run each, or quote a value "
                              "with a comma ('key=\"a,b\"'); a list is key=[a,b]")
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            if key not in HYDRA_KEYS:
                raise ConfigError(key, "Hydra's own settings are not ncclrl keys; the one every command reads: "
                                  "hydra.verbose=true (debug logging)")
            continue
        if o.get_key_element()[:1] == "~":
            raise ConfigError(key, "a key cannot be removed; set it (key=value), or leave it out for its default")
        if key in groups:
            value = o.value()
            if not isinstance(value, str) or value not in groups[key]:
                raise ConfigError(key, f"unknown option {value!r}; allowed: {', '.join(groups[key])}")
            continue
        if key not in keys:  # with a '+' too: a key a command does not read would be ignored silently
            raise ConfigError(key, unknown_key(cmd, key, keys, groups))
        if o.get_key_element()[:2] == "+" + key[:1]:  # '+key=' adds a key; every key a command reads is there
            raise ConfigError(key, f"set it without the +: {key}={o.get_value_element_as_str()}")
    overrides = [_as_list(o, keys) for o in overrides]
    # a key named like one of ncclrl.conf's groups that is not a group of this command (predict's noise=):
    # Hydra would read it as a group option, so it is set on the composed config instead
    shadowed = _conf_groups() - set(groups)
    late = [o for o in parse_overrides(overrides) if o.key_or_group in shadowed]
    overrides = [o for o in overrides if o not in [p.input_line for p in late]]
    ConfigStore.instance().store(group="hydra/job_logging", name="ncclrl", node=JOB_LOGGING)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="ncclrl.conf", version_base="1.3"):
            cfg = compose(config_name=_config_name(cmd.name), overrides=["hydra/job_logging=ncclrl", *overrides],
                          return_hydra_config=True)
        for o in late:
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
    except (HydraException, OmegaConfBaseException) as e:
        cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else e
        key = getattr(cause, "full_key", None)
        m = re.search(r"full_key: (\S+)", str(cause))
        raise ConfigError(str(key or (m.group(1) if m else "overrides")), _clean(str(cause))) from None
    finally:
        GlobalHydra.instance().clear()
    with open_dict(cfg):
        hydra_cfg = cfg.pop("hydra")
    resolve(cfg, keys)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(re.sub(r"\[\d+\]$", "", missing[0]), "??? marks a missing value, it is not one; give "
                          "the value, or leave the key out for its default")
    if setup_logging:
        configure_log(hydra_cfg.job_logging, hydra_cfg.verbose)
    if check:
        try:
            check_lists(cmd, cfg)
            check_numbers(cmd, cfg)
            check_topologies(cmd, cfg, {o.key_or_group for o in parsed})
            check_sizes(cmd, cfg)
            check_outputs(cmd, cfg)
            if hasattr(cmd.schema, "check"):
                OmegaConf.to_object(cfg).check()
        except OSError as e:  # a path the system cannot look up (a name too long): the key that names it
            name = str(e.filename or "")
            shown = name if len(name) <= 60 else name[:57] + "..."
            limit = " (a file or folder name is at most 255 bytes)" if e.errno == errno.ENAMETOOLONG else ""
            raise ConfigError(_key_naming(cfg, keys, name), f"cannot look up {shown or 'a path'}: {e.strerror}"
                              f"{limit}") from None
    return cfg


def parse_overrides(overrides: list[str]) -> list[Any]:
    """Hydra's reading of ``overrides``; one that its grammar refuses is one line naming its key."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    try:
        return parser.parse_overrides(overrides)
    except HydraException as e:
        error = e
    for text in overrides:  # the one Hydra cannot read
        try:
            parser.parse_overrides([text])
        except HydraException as e:
            key = text.partition("=")[0].lstrip("+~") or "overrides"
            shown = repr(text if len(text) <= 60 else text[:57] + "...")
            raise ConfigError(key, f"cannot read {shown} ({_syntax_reason(str(e), text)}); write key=value, and quote "
                              "a value holding quotes, brackets, braces, parentheses, '=' or ',': key='...'") from None
    raise ConfigError("overrides", f"{_clean(str(error))}; write key=value")


def _syntax_reason(message: str, text: str) -> str:
    """What Hydra's grammar refused, without its token list and link."""
    reason = " ".join(message.split()).replace(f"Error parsing override '{text}' ", "")
    reason = re.sub(r"\s*See https?://\S+ for details\.?", "", reason)
    reason = re.sub(r" expecting (\{[^}]*\}|<EOF>|\S+)", "", reason)
    if reason.startswith("LexerNoViableAltException"):
        return "a character the grammar does not take there"
    return reason


def _conf_groups() -> set[str]:
    """The config groups of ncclrl.conf (folders of options), whatever command reads them."""
    return {p.name for p in files("ncclrl.conf").iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}


def _key_naming(cfg: DictConfig, keys: dict[str, type], name: str) -> str:
    """The key whose value is the path ``name`` (or holds it, or is part of it); else ``overrides``."""
    from omegaconf import OmegaConf

    values = []
    for key in keys:
        value = OmegaConf.select(cfg, key)
        values += [(key, v) for v in (list(value) if OmegaConf.is_list(value) else [value]) if isinstance(v, str) and v]
    for test in (lambda v: v == name or str(Path(v).expanduser()) == name, lambda v: name and (name in v or v in name)):
        for key, v in values:
            if test(v):
                return key
    return "overrides"


def resolve(cfg: DictConfig, keys: dict[str, type]) -> None:
    """Resolve the interpolations (``${key}``, ``${oc.env:VAR}``) once, in place: a loop or a
    missing variable is one line naming the key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    key = "overrides"
    try:
        for key in keys:
            OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
        key = "overrides"
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(key, f"cannot resolve the interpolation: {_clean(str(e))}; write the value itself") \
            from None


# Hydra's own settings a command line may set (every other hydra.* override is refused)
HYDRA_KEYS = ("hydra.verbose",)


def unknown_key(cmd: Command, key: str, keys: dict[str, type], groups: dict[str, list[str]]) -> str:
    """The message for a key ``cmd`` does not have: the valid keys closest to it by spelling (within
    its group, ``agent.lr``: the ``agent.`` keys; else every key by its last part), else every key
    of its group, else every top-level key."""
    name = key.lstrip("+")
    leaves = [k for k in keys if not dataclasses.is_dataclass(keys[k])]
    prefix = name.rsplit(".", 1)[0] + "." if "." in name else ""
    members = [k for k in leaves if prefix and k.startswith(prefix) and "." not in k[len(prefix):]]
    if members:
        leaf = name.rsplit(".", 1)[-1]
        close = [prefix + m for m in difflib.get_close_matches(leaf, [k[len(prefix):] for k in members], n=4,
                                                               cutoff=0.6)] or members
    else:
        by_leaf: dict[str, list[str]] = {}
        for k in leaves:
            by_leaf.setdefault(k.rsplit(".", 1)[-1], []).append(k)
        close = [k for leaf in difflib.get_close_matches(name.rsplit(".", 1)[-1], list(by_leaf), n=4, cutoff=0.6)
                 for k in by_leaf[leaf]]
    if close:
        return f"unknown key; close keys: {', '.join(close[:12])} (all: ncclrl {cmd.name} --help)"
    allowed = ", ".join(k for k in keys if "." not in k or k.split(".")[0] in groups)
    return f"unknown key; allowed: {allowed}"


# the largest size a key may name: 2^62 bytes, so that a doubled size still fits the store's 64-bit integers
MAX_BYTES = 1 << 62
# keys naming a folder a command writes into, and keys naming a file it writes (its folder must exist)
FOLDER_KEYS = ("out", "run_dir", "log_dir")
FILE_KEYS = ("output", "plot")


def check_sizes(cmd: Command, cfg: DictConfig) -> None:
    """Every ``*_bytes`` key a size from 1 to :data:`MAX_BYTES` (one line naming the key)."""
    from omegaconf import OmegaConf

    from ncclrl.costmodel.units import parse_bytes

    for key in _keys(cmd.schema):
        if not key.rsplit(".", 1)[-1].endswith("_bytes"):
            continue
        value = OmegaConf.select(cfg, key)
        if value is None or OmegaConf.is_config(value) or value == "":
            continue
        n = parse_bytes(str(value), key)
        if n > MAX_BYTES:
            raise ConfigError(key, f"{value} is beyond the largest size; allowed: a whole number of bytes from 1 to "
                              f"2^62 ({MAX_BYTES}), with an optional K, M or G suffix")


def check_lists(cmd: Command, cfg: DictConfig) -> None:
    """Every list of plain values (files, names, numbers) holds plain values: ``key=[[a]]`` or
    ``key={a: 1}`` is one line naming the key."""
    from omegaconf import OmegaConf

    for key, tp in _keys(cmd.schema).items():
        if _type_name(tp) != "list" or _element_type(tp) not in (str, int, float, bool):
            continue
        value = OmegaConf.select(cfg, key)
        if OmegaConf.is_list(value) and any(OmegaConf.is_config(v) for v in value):
            raise ConfigError(key, f"a list of {_element_type(tp).__name__} values, got "
                              f"{OmegaConf.to_container(value)!r}; write {key}=[a,b]")


def _element_type(tp: Any) -> Any:
    """The element type of a list type (``list[str]``, ``list[str] | None``), else ``Any``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next((a for a in typing.get_args(tp) if a is not type(None)), Any)
    args = typing.get_args(tp)
    return args[0] if typing.get_origin(tp) in (list, tuple) and args else Any


# the largest magnitude of a whole-number key (counts, seeds, budgets): 2^62, within SQLite's 64-bit integers
MAX_INT = 1 << 62
# a job that makes no progress for this long is ended: below a second, every job would end before it starts
MIN_TIMEOUT_S = 1.0


def check_numbers(cmd: Command, cfg: DictConfig) -> None:
    """Every number a finite one: a float key (and each float of a list) neither NaN nor infinite,
    a whole-number key within +-2^62, every ``timeout_s`` at least :data:`MIN_TIMEOUT_S` (one line
    naming the key)."""
    from omegaconf import OmegaConf

    for key in _keys(cmd.schema):
        value = OmegaConf.select(cfg, key)
        values = list(value) if OmegaConf.is_list(value) else [value]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(key, f"must be a finite number, got {v}")
            if isinstance(v, int) and abs(v) > MAX_INT:
                raise ConfigError(key, f"{v} is out of range; allowed: whole numbers from -2^62 to 2^62")
            if key.rsplit(".", 1)[-1] == "timeout_s" and v < MIN_TIMEOUT_S:
                raise ConfigError(key, f"must be >= {MIN_TIMEOUT_S:g} s (a job is ended after this long without "
                                  f"progress), got {v}")


def check_topologies(cmd: Command, cfg: DictConfig, given: set[str]) -> None:
    """Every ``topology`` key names something: not a folder, and not empty where the command line
    set it (``topology=$TOPO`` with ``TOPO`` unset); ``given``: the keys the command line set."""
    from omegaconf import OmegaConf

    from ncclrl.costmodel.topology import preset_names

    for key in _keys(cmd.schema):
        if key.rsplit(".", 1)[-1] != "topology":
            continue
        value = OmegaConf.select(cfg, key)
        if not isinstance(value, str):
            continue
        allowed = f"allowed: a preset ({', '.join(preset_names())}) or a topology .yaml file"
        if not value.strip():
            if key in given:
                raise ConfigError(key, f"empty (an unset shell variable?); {allowed}")
            continue  # not given: the command says it is required, or uses its own default
        if Path(value).expanduser().is_dir():
            raise ConfigError(key, f"{value} is a folder; {allowed}")


def check_outputs(cmd: Command, cfg: DictConfig) -> None:
    """Before anything runs: every folder the command writes can be created, and every file it
    writes lies in an existing, writable folder (one line naming the key)."""
    from omegaconf import OmegaConf

    files_ = set(FILE_KEYS) | set(getattr(cmd.schema, "FILE_KEYS", ()))
    for key in _keys(cmd.schema):
        if "." in key or key not in set(FOLDER_KEYS) | files_:
            continue
        value = OmegaConf.select(cfg, key)
        if not value or not isinstance(value, str):
            continue
        path = Path(value).expanduser()
        folder = path.parent if key in files_ else path
        if key in files_ and path.is_dir():
            raise ConfigError(key, f"{value} is a folder; name a file to write")
        if key in files_ and not folder.is_dir():
            raise ConfigError(key, f"the folder {folder} does not exist; create it, or name a file in an existing "
                              "folder")
        probe = folder
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if not probe.is_dir():
            raise ConfigError(key, f"cannot create {folder}: {probe} is a file, not a folder")
        if not (probe.stat().st_mode & 0o222) or not os.access(probe, os.W_OK | os.X_OK):
            raise ConfigError(key, f"cannot write in {probe} (read-only); name a folder you can write")


def _as_list(override: str, keys: dict[str, type]) -> str:
    """``key=value`` for a list key is the one-element list ``key=[value]``."""
    key, sep, value = override.partition("=")
    name = key.lstrip("+~")
    if sep and name in keys and _type_name(keys[name]) == "list" and value and not value.startswith("["):
        return f"{key}=[{value}]"
    return override


def job_overrides(overrides: list[str]) -> list[list[str]]:
    """``-m``: one override list per combination of the comma-separated values, in order."""
    parsed = parse_overrides(overrides)
    choices = []
    for o in parsed:
        if o.is_sweep_override():
            prefix = o.get_key_element()
            choices.append([f"{prefix}={v}" for v in o.sweep_string_iterator()])
        else:
            choices.append([o.input_line])
    return [list(c) for c in itertools.product(*choices)]


def split_argv(cmd: Command, argv: list[str]) -> tuple[list[str], bool]:
    """Overrides and the multirun flag; bare words become the positional key (after ``--``, every
    word is one). ``--key=value`` is ``key=value`` for a key of the command; any other word that
    looks like a flag is one line naming it."""
    keys = _keys(cmd.schema)
    groups = dict(_groups(cmd.schema))
    names = set(keys) | set(groups) | set(HYDRA_KEYS)
    multirun = only_words = False
    overrides, bare = [], []
    for a in argv:
        flag = re.fullmatch(r"--?([A-Za-z_][\w.-]*)(=.*)?", a, re.S)
        if only_words:
            bare.append(a)
        elif a == "--":
            only_words = True
        elif a in ("-m", "--multirun"):
            multirun = True
        elif flag and flag.group(2) is not None and a.startswith("--"):  # --key=value
            key, value = flag.group(1), flag.group(2)[1:]
            shown = a if len(a) <= 40 else a[:37] + "..."
            if key not in names:
                raise ConfigError(shown, f"{unknown_key(cmd, key, keys, groups)}; arguments are key=value")
            overrides.append(f"{key}={value}")
        elif flag:
            key = flag.group(1)
            shown = a if len(a) <= 40 else a[:37] + "..."
            if key in names:
                raise ConfigError(shown, f"write {key}=VALUE: arguments are key=value (ncclrl {cmd.name} --help)")
            raise ConfigError(shown, f"unknown option; arguments are key=value, the flags -m, --cfg job and --help "
                              f"(ncclrl {cmd.name} --help)")
        elif re.fullmatch(r"~[\w.]+", a) or ("=" in a and not a.startswith("/")
                                              and re.match(r"^[+~]{0,2}[\w./-]+=", a)):
            overrides.append(a)
        else:
            bare.append(a)
    if bare:
        if cmd.positional is None:
            if bare[0] in names:
                raise ConfigError(bare[0], f"write {bare[0]}=VALUE: arguments are key=value (ncclrl {cmd.name} --help)")
            raise ConfigError(cmd.name, f"arguments are key=value, got {bare[0]!r}; see ncclrl {cmd.name} --help")
        is_list = _type_name(keys[cmd.positional]) == "list"
        if not is_list and len(bare) > 1:
            raise ConfigError(cmd.positional, f"takes one value, got {len(bare)}: {' '.join(bare)}")
        quoted = [_quote(b) for b in bare]
        overrides.insert(0, f"{cmd.positional}=[{','.join(quoted)}]" if is_list else f"{cmd.positional}={quoted[0]}")
    return overrides, multirun


def _quote(value: str) -> str:
    """A path as one Hydra value, whatever characters it holds."""
    if re.fullmatch(r"[\w./-]+", value) and not re.fullmatch(r"[\d.]+|true|false|null", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def parse(cmd: Command, argv: list[str]) -> DictConfig:
    """One command line (no ``-m``) as the command's composed, checked config."""
    overrides, multirun = split_argv(cmd, argv)
    if multirun:
        raise ConfigError(cmd.name, "-m runs several jobs; parse one command line at a time")
    return compose_config(cmd, overrides)


def command_jobs(cmd: Command, argv: list[str], check: bool = True, setup_logging: bool = False
                 ) -> tuple[list[tuple[list[str], DictConfig]], bool]:
    """The jobs one command line runs, each its overrides and composed config, and whether it is a
    multirun (``-m``: every combination, each checked before any runs, each in its own output folder)."""
    overrides, multirun = split_argv(cmd, argv)
    if not multirun:
        return [(overrides, compose_config(cmd, overrides, check=check, setup_logging=setup_logging))], False
    out = [(j, compose_config(cmd, j, check=check, setup_logging=setup_logging)) for j in job_overrides(overrides)]
    for i, (j, cfg) in enumerate(out):
        if cmd.out_key and not any(o.split("=", 1)[0].lstrip("+~") == cmd.out_key for o in j):
            base = cfg[cmd.out_key] or f"multirun/{cmd.name.replace(' ', '-')}"
            cfg[cmd.out_key] = f"{base}/{i}"
    return out, True


def run_command(cmd: Command, argv: list[str]) -> int:
    """Compose, check and run one command line (``-m``: every combination, one after another)."""
    todo, multirun = command_jobs(cmd, argv, setup_logging=True)
    if not multirun:
        return int(cmd.run(todo[0][1]) or 0)
    worst = 0
    for i, (j, cfg) in enumerate(todo):
        log.info("# job %d of %d: %s", i + 1, len(todo), " ".join(j) or "(defaults)")
        worst = max(worst, int(cmd.run(cfg) or 0))
    return worst


def composed_yaml(cmd: Command, argv: list[str]) -> str:
    """``--cfg job``: the config each job of the command line would run with, as YAML; composed (keys
    and types checked), not checked further, nothing run."""
    from omegaconf import OmegaConf

    todo, multirun = command_jobs(cmd, argv, check=False)
    if not multirun:
        return OmegaConf.to_yaml(todo[0][1]).rstrip("\n")
    return "\n---\n".join(f"# job {i + 1} of {len(todo)}: {' '.join(j) or '(defaults)'}\n"
                           + OmegaConf.to_yaml(cfg).rstrip("\n") for i, (j, cfg) in enumerate(todo))
