"""``litellm-ratebalance``: command-line tools for operators.

``check-config CONFIG``  validate our settings in a LiteLLM config.yaml (exit 0, or 78 with key paths)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from litellm_ratebalance.errors import ConfigurationError

__all__ = ["main"]

EXIT_CONFIG = 78


def load_config_settings(path: Path) -> dict[str, Any]:
    """The ``litellm_settings``-shaped mapping our settings are read from, taken from a config file."""
    import yaml

    config = yaml.safe_load(path.read_text("utf-8")) or {}
    if not isinstance(config, dict):
        raise ConfigurationError(f"{path}: the config file is not a mapping")
    litellm_settings = dict(config.get("litellm_settings") or {})
    general = config.get("general_settings") or {}
    if isinstance(general, dict) and general.get("token_rate_limit_type") is not None:
        litellm_settings["token_rate_limit_type"] = general["token_rate_limit_type"]
    return litellm_settings


def check_config(path: Path) -> int:
    from litellm_ratebalance.settings import parse_settings

    try:
        parse_settings(load_config_settings(path))
    except (ConfigurationError, OSError) as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as exc:  # YAML syntax errors and the like
        print(f"{path}: cannot read the config: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"{path}: litellm_ratebalance settings are valid")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="litellm-ratebalance", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check-config", help="validate our settings in a LiteLLM config.yaml")
    check.add_argument("config", type=Path)
    args = parser.parse_args(argv)
    if args.command == "check-config":
        return check_config(args.config)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
