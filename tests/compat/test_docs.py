"""The documentation site's promises, checked against the code (no server, no cargo).

- docs/compatibility.toml (the compatibility matrix, rendered in
  docs/src/concepts/compatibility.md) lists every admin route the admin crate registers and
  every protocol command the broker's dispatch answers, with a state that is not "not"; and
  every route or command it marks supported or partly exists in the code. The routes are read
  from the Rust source of crates/admin/src/routes/ by a small evaluator of the one registration
  pattern used there (`.route(PATH, METHODS)` inside `build`, `topic_op_routes`,
  `policy_routes`, `backlog_quota_routes` and `console::routes`); anything it does not
  understand fails the test loudly instead of being skipped, and it must find at least
  MIN_ROUTES routes, so a refactor cannot make the check vacuous.
- docs/src/concepts/compatibility.md is exactly what render_compatibility_page() makes of the
  data file; after editing docs/compatibility.toml, rewrite it with
  `python3 tests/compat/test_docs.py --write-compatibility-page`.
- Every relative link in docs/src/**/*.md and README.md points to a file that exists, and
  docs/src/SUMMARY.md lists every page under docs/src (and nothing that does not exist).
- Every shell block marked ```sh,runnable in docs/src runs, as written, from the repository
  root with the release binary, and exits 0 (the only test here that needs the binary).

Pure Python (stdlib and tomllib, Python 3.11+). It uses no fixture of conftest.py, so it never
starts a server.
"""

import os
import re
import tomllib

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ROUTES_DIR = os.path.join(REPO_ROOT, "crates", "admin", "src", "routes")
CONNECTION_RS = os.path.join(REPO_ROOT, "crates", "broker", "src", "connection", "mod.rs")
PROTO = os.path.join(REPO_ROOT, "crates", "protocol", "proto", "pulsar_api.proto")
MATRIX = os.path.join(REPO_ROOT, "docs", "compatibility.toml")
DOCS_SRC = os.path.join(REPO_ROOT, "docs", "src")
MATRIX_PAGE = os.path.join(DOCS_SRC, "concepts", "compatibility.md")

MIN_ROUTES = 50
MIN_COMMANDS = 15
STATES = {"supported", "partly", "not"}
METHODS = {"GET", "PUT", "POST", "DELETE", "PATCH", "HEAD"}
# Handlers that are registered only to refuse with the reason (Pulsar's status for a feature
# that is not built): such a route is in the code, but its honest state is "not".
REFUSING_HANDLER = re.compile(r"not_supported|not_implemented|unsupported")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------------------------- Rust text
def _strip_comments(text):
    """Rust source without // comments (string literals kept; none here holds //)."""
    out = []
    for line in text.splitlines():
        in_str = False
        cut = len(line)
        i = 0
        while i < len(line):
            c = line[i]
            if c == '"' and (i == 0 or line[i - 1] != "\\"):
                in_str = not in_str
            elif not in_str and line.startswith("//", i):
                cut = i
                break
            i += 1
        out.append(line[:cut])
    return "\n".join(out)


def _matching(text, open_index):
    """Index of the bracket closing the one at open_index (string literals skipped)."""
    closer = {"(": ")", "[": "]", "{": "}"}[text[open_index]]
    for i, _ in _top_level(text, open_index + 1, closer):
        return i
    raise AssertionError("unbalanced %r at offset %d" % (text[open_index], open_index))


def _top_level(text, start, targets):
    """Yields (index, char) of each char of `targets` in `text` from `start` that is outside
    string literals and brackets opened after `start`."""
    depth, in_str, i = 0, False, start
    while i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 2
                continue
            if c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in targets and depth == 0:
            yield i, c  # a closing bracket here is the enclosing one's
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        i += 1


def _split_top(args):
    """Splits a Rust argument list at its top-level commas."""
    parts, start = [], 0
    for i, _ in _top_level(args, 0, ","):
        parts.append(args[start:i].strip())
        start = i + 1
    tail = args[start:].strip()
    if tail:
        parts.append(tail)
    return parts


def _function_body(text, signature_regex, where):
    m = re.search(signature_regex, text)
    assert m, "%s: no function matching %r (the route registration changed: update %s)" % (
        where, signature_regex, os.path.basename(__file__))
    brace = text.index("{", m.end())
    return text[brace + 1:_matching(text, brace)]


def _string_const(text, name, where):
    m = re.search(r"const\s+%s\s*:\s*&str\s*=\s*\"([^\"]*)\"\s*;" % re.escape(name), text)
    assert m, "%s: no string constant %s" % (where, name)
    return m.group(1)


class _RouteReader:
    """Evaluates the admin crate's route registration, as written, into (path, method) pairs."""

    def __init__(self):
        self.mod_rs = _strip_comments(_read(os.path.join(ROUTES_DIR, "mod.rs")))
        self.policies_rs = _strip_comments(_read(os.path.join(ROUTES_DIR, "policies.rs")))
        self.console_rs = _strip_comments(_read(os.path.join(ROUTES_DIR, "console.rs")))
        self.expiry_rs = _strip_comments(_read(os.path.join(ROUTES_DIR, "expiry.rs")))
        self.routes = set()  # (path as registered, METHOD)

    # -- expressions
    def _path(self, expr, env):
        expr = expr.strip()
        if expr.startswith("&"):
            expr = expr[1:].strip()
        if re.fullmatch(r'"[^"]*"', expr):
            return expr[1:-1]
        if expr.startswith("format!("):
            inner = expr[len("format!("):_matching(expr, len("format!(") - 1)]
            parts = _split_top(inner)
            assert parts and re.fullmatch(r'"[^"]*"', parts[0]), "format! without a literal: %s" % expr
            return self._format(parts[0][1:-1], [self._path(a, env) for a in parts[1:]], env)
        if re.fullmatch(r"[a-z_][a-z0-9_]*", expr):
            assert expr in env, "unknown variable %r in a route path" % expr
            return env[expr]
        m = re.fullmatch(r"expiry::([A-Z_]+)", expr)
        if m:
            return _string_const(self.expiry_rs, m.group(1), "expiry.rs")
        if expr in env:  # e.g. spec.path
            return env[expr]
        raise AssertionError("route path expression not understood: %r" % expr)

    @staticmethod
    def _format(template, positional, env):
        out, i, pos = [], 0, 0
        while i < len(template):
            if template.startswith("{{", i):
                out.append("{")
                i += 2
            elif template.startswith("}}", i):
                out.append("}")
                i += 2
            elif template[i] == "{":
                end = template.index("}", i)
                name = template[i + 1:end]
                if name == "":
                    out.append(positional[pos])
                    pos += 1
                else:
                    assert name in env, "format! names unknown variable {%s}" % name
                    out.append(env[name])
                i = end + 1
            else:
                out.append(template[i])
                i += 1
        assert pos == len(positional), "format! %r: %d arguments unused" % (template, len(positional) - pos)
        return "".join(out)

    @staticmethod
    def _methods(expr):
        """The HTTP methods of a method-router chain: get(..).put(..).delete(..)."""
        found, depth, i, in_str = [], 0, 0, False
        while i < len(expr):
            c = expr[i]
            if in_str:
                if c == "\\":
                    i += 2
                    continue
                if c == '"':
                    in_str = False
                i += 1
                continue
            if c == '"':
                in_str = True
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
            elif depth == 0:
                m = re.match(r"\.?\s*(get|put|post|delete|patch|head)\s*\(", expr[i:])
                if m and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] == "_")):
                    found.append(m.group(1).upper())
                    i += m.end() - 1  # at the "(", counted next round
                    continue
            i += 1
        assert found, "no HTTP method in %r" % expr[:120]
        return found

    # -- statements
    def _run(self, body, env):
        """Walks a function body: `let` bindings, `for domain in TopicDomain::ALL` loops,
        `.route(..)` calls and the helper calls that add routes."""
        env = dict(env)
        i = 0
        pattern = re.compile(
            r"let\s+(?:mut\s+)?(?P<let>[a-z_][a-z0-9_]*)\s*=\s*"
            r"|for\s+(?P<loopvar>[a-z_]+)\s+in\s+(?P<iter>[A-Za-z_:]+)\s*\{"
            r"|\.route\s*\("
            r"|(?:policies::)?policy_routes\s*\("
            r"|(?<![a-z_])topic_op_routes\s*\("
            r"|console::routes\s*\("
            r"|(?<![a-z_:])backlog_quota_routes\s*\(")
        while True:
            m = pattern.search(body, i)
            if not m:
                return
            token = m.group(0)
            if m.group("let"):
                value = body[m.end():].lstrip()
                if value.startswith(('"', "format!", "&format!")):
                    end = self._statement_end(body, m.end())
                    env[m.group("let")] = self._path(body[m.end():end], env)
                    i = end + 1
                else:  # `let mut router = Router::new().route(..)...`: walk into it
                    i = m.end()
            elif m.group("loopvar"):
                brace = m.end() - 1
                close = _matching(body, brace)
                assert m.group("iter") == "TopicDomain::ALL" and m.group("loopvar") == "domain", \
                    "unknown loop in the route registration: %s" % token
                self._check_domains()
                for domain in ("persistent", "non-persistent"):
                    self._run(body[brace + 1:close], dict(env, domain=domain))
                i = close + 1
            else:
                paren = m.end() - 1
                close = _matching(body, paren)
                args = _split_top(body[paren + 1:close])
                if token.startswith(".route"):
                    assert len(args) == 2, "route(...) with %d arguments" % len(args)
                    path = self._path(args[0], env)
                    if re.fullmatch(r"\w+\.route\(\w+\)", args[1].replace(" ", "")):
                        raise AssertionError("a MethodRouter from %r outside policy_routes" % args[1])
                    for method in self._methods(args[1]):
                        self.routes.add((path, method))
                elif "policy_routes" in token:
                    assert len(args) == 3, "policy_routes(...) with %d arguments" % len(args)
                    self._policy_routes(self._path(args[1], env), args[2])
                elif "topic_op_routes" in token:
                    if "router" in args[0] and len(args) == 2:
                        topic = self._path(args[1], env)
                        ops = _function_body(self.mod_rs, r"fn\s+topic_op_routes\s*\(", "mod.rs")
                        self._run(ops, {"topic": topic})
                elif token.startswith("console::routes"):
                    body_c = _function_body(self.console_rs, r"fn\s+routes\s*\(", "console.rs")
                    self._run(body_c, {})
                elif "backlog_quota_routes" in token:
                    base = self._path(args[1], env)
                    body_b = _function_body(self.policies_rs, r"fn\s+backlog_quota_routes\s*\(",
                                            "policies.rs")
                    self._run(body_b, {"base": base})
                i = close + 1

    @staticmethod
    def _statement_end(body, start):
        for i, _ in _top_level(body, start, ";"):
            return i
        raise AssertionError("unterminated statement")

    def _check_domains(self):
        names = _strip_comments(_read(os.path.join(REPO_ROOT, "crates", "model", "src", "names.rs")))
        m = re.search(r"const\s+ALL\s*:\s*\[TopicDomain;\s*2\]\s*=\s*\[([^\]]*)\]", names)
        assert m, "TopicDomain::ALL is not the two domains any more: update this test"
        assert re.sub(r"\s", "", m.group(1)) == "TopicDomain::Persistent,TopicDomain::NonPersistent"

    def _policy_routes(self, base, level_expr):
        level = level_expr.strip().split("::")[-1]
        const = {"Namespace": "NAMESPACE_POLICIES", "Topic": "TOPIC_POLICIES"}[level]
        body = _function_body(self.policies_rs, r"fn\s+policy_routes\s*\(", "policies.rs")
        assert "spec.route(level)" in body.replace(" ", "") or "spec.route(level)" in body, \
            "policy_routes no longer registers spec.route(level): update this test"
        assert "backlog_quota_routes(router, base, level)" in body
        route_fn = _function_body(self.policies_rs, r"fn\s+route\s*\(\s*&'static\s+self", "policies.rs")
        flat = re.sub(r"\s+", "", route_fn)
        assert "ifself.put{getter.put(setter)}else{getter.post(setter)}" in flat and \
            ".delete(" in flat and "get(move" in flat, \
            "PolicySpec::route no longer registers GET, POST|PUT and DELETE: update this test"
        for path, put in self._specs(const):
            for method in ("GET", "PUT" if put else "POST", "DELETE"):
                self.routes.add(("%s/%s" % (base, path), method))
        body_b = _function_body(self.policies_rs, r"fn\s+backlog_quota_routes\s*\(", "policies.rs")
        self._run(body_b, {"base": base})

    def _specs(self, const):
        m = re.search(r"const\s+%s\s*:\s*&\[PolicySpec\]\s*=\s*&\[" % const, self.policies_rs)
        assert m, "policies.rs has no %s" % const
        start = m.end() - 1
        block = self.policies_rs[start + 1:_matching(self.policies_rs, start)]
        specs, i = [], 0
        while True:
            j = block.find("PolicySpec {", i)
            if j < 0:
                break
            brace = block.index("{", j)
            close = _matching(block, brace)
            fields = block[brace + 1:close]
            path = re.search(r'\bpath:\s*"([^"]+)"', fields)
            assert path, "a PolicySpec without a path literal in %s" % const
            put = re.search(r"\bput:\s*(true|false)", fields)
            specs.append((path.group(1), bool(put and put.group(1) == "true")))
            i = close + 1
        assert len(specs) >= 10, "%s: only %d policies found" % (const, len(specs))
        return specs

    def read(self):
        build = _function_body(self.mod_rs, r"fn\s+build\s*\(\s*state", "mod.rs")
        self._run(build, {})
        return self.routes


def _normalise(path):
    """A route pattern with its parameters as {} and the topic domain as `persistent`."""
    path = re.sub(r"\{[^}]*\}", "{}", path)
    path = path.replace("/non-persistent/", "/persistent/")
    if len(path) > 1:
        path = path.rstrip("/")
    return path


def registered_admin_routes():
    """{(normalised path, METHOD): [paths as registered]} of the admin router."""
    routes = _RouteReader().read()
    assert len(routes) >= MIN_ROUTES, (
        "found only %d admin routes in crates/admin/src/routes: the registration pattern changed "
        "and this test no longer reads it; update _RouteReader" % len(routes))
    out = {}
    for path, method in routes:
        out.setdefault((_normalise(path), method), []).append(path)
    return out


def refusing_routes():
    """(path suffix, METHOD) of the routes in routes/mod.rs whose handler only refuses, by its
    name (as `compaction_not_supported` answered 501 before compaction was built)."""
    mod_rs = _strip_comments(_read(os.path.join(ROUTES_DIR, "mod.rs")))
    refusing = set()
    for m in re.finditer(r"\.route\s*\(", mod_rs):
        paren = m.end() - 1
        args = _split_top(mod_rs[paren + 1:_matching(mod_rs, paren)])
        if len(args) != 2:
            continue
        for method, handler in re.findall(r"\b(get|put|post|delete|patch)\(\s*([\w:]+)\s*\)", args[1]):
            if REFUSING_HANDLER.search(handler):
                tail = re.search(r'"(?:\{\w+\})*(/[^"]*)"', args[0])
                assert tail, "a refusing route whose path is not a literal suffix: %s" % args[0]
                refusing.add((tail.group(1), method.upper()))
    return refusing


def _matrix():
    with open(MATRIX, "rb") as f:
        return tomllib.load(f)


def _admin_entries():
    entries = {}
    for entry in _matrix().get("admin", []):
        for field in ("route", "method", "pulsar_admin", "state", "note"):
            assert field in entry, "an [[admin]] entry without %s: %r" % (field, entry)
        assert entry["state"] in STATES, entry
        for method in entry["method"].split("|"):
            method = method.strip()
            assert method in METHODS, entry
            key = (_normalise(entry["route"]), method)
            assert key not in entries, "%s %s is in compatibility.toml twice" % (method, entry["route"])
            entries[key] = entry
    return entries


# ---------------------------------------------------------------------------------- the tests
def test_compatibility_matrix_covers_admin_routes():
    code = registered_admin_routes()
    matrix = _admin_entries()
    refusing = {(suffix, method) for suffix, method in refusing_routes()}

    def refuses(key):
        path, method = key
        return any(method == m and path.endswith(_normalise(s)) for s, m in refusing)

    missing = sorted("%s %s" % (m, p) for (p, m) in code if (p, m) not in matrix)
    assert not missing, "admin routes registered in crates/admin but not in docs/compatibility.toml:\n" \
        + "\n".join(missing)
    wrong = []
    for key in code:
        state = matrix[key]["state"]
        if refuses(key):
            if state != "not":
                wrong.append("%s %s: its handler refuses (%s), so its state is \"not\"" % (
                    key[1], key[0], state))
        elif state == "not":
            wrong.append("%s %s is registered, but compatibility.toml says \"not\"" % (key[1], key[0]))
    assert not wrong, "\n".join(wrong)
    phantom = sorted("%s %s" % (k[1], e["route"]) for k, e in matrix.items()
                     if e["state"] != "not" and k not in code)
    assert not phantom, "compatibility.toml marks routes the code does not register as " \
        "supported or partly:\n" + "\n".join(phantom)


def _camel_to_proto(name):
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).upper()


def broker_dispatch():
    """(handled, refused): the BaseCommand types the broker's connection answers, and those it
    answers with ERROR as unsupported, from `Connection::handle`'s match."""
    text = _strip_comments(_read(CONNECTION_RS))
    body = _function_body(text, r"async\s+fn\s+handle\s*\(\s*&mut\s+self\s*,\s*frame", "connection/mod.rs")
    m = re.search(r"match\s+kind\s*\{", body)
    assert m, "Connection::handle has no `match kind`: update this test"
    brace = m.end() - 1
    arms = body[brace + 1:_matching(body, brace)]
    handled = set()
    for arm in re.finditer(r"(?m)^\s*((?:Type::\w+\s*\|?\s*)+)(?:if\s[^=]*)?=>", arms):
        for name in re.findall(r"Type::(\w+)", arm.group(1)):
            handled.add(_camel_to_proto(name))
    assert re.search(r"other\s*=>\s*\{\s*self\.on_unsupported", arms), \
        "the dispatch's fallback arm changed: update this test"
    unsupported = _function_body(text, r"fn\s+on_unsupported\s*\(", "connection/mod.rs")
    refused = {_camel_to_proto(n) for n in re.findall(r"Type::(\w+)", unsupported)}
    assert len(handled) >= MIN_COMMANDS, "found only %d commands in the dispatch" % len(handled)
    return handled, refused - handled


def proto_command_types():
    text = _read(PROTO)
    m = re.search(r"message\s+BaseCommand\s*\{\s*enum\s+Type\s*\{", text)
    assert m, "pulsar_api.proto: no BaseCommand.Type"
    block = text[m.end():text.index("}", m.end())]
    return set(re.findall(r"(?m)^\s*([A-Z_]+)\s*=\s*\d+\s*;", block))


def broker_sent_commands():
    """Command types the broker writes (answers and events), from the constructors it uses."""
    sent = set()
    roots = [os.path.join(REPO_ROOT, "crates", "protocol", "src", "commands.rs")]
    for base, _, files in os.walk(os.path.join(REPO_ROOT, "crates", "broker", "src")):
        roots += [os.path.join(base, f) for f in files if f.endswith(".rs")]
    for path in roots:
        for name in re.findall(r"base\(Type::(\w+)\)", _read(path)):
            sent.add(_camel_to_proto(name))
    return sent


def test_compatibility_matrix_covers_protocol_commands():
    handled, refused = broker_dispatch()
    all_types = proto_command_types()
    assert handled <= all_types, "dispatch names types the .proto lacks: %s" % (handled - all_types)
    sent = broker_sent_commands()
    entries = {}
    for entry in _matrix().get("command", []):
        for field in ("name", "state", "note"):
            assert field in entry, "a [[command]] entry without %s: %r" % (field, entry)
        assert entry["state"] in STATES, entry
        assert entry["name"] not in entries, "%s is in compatibility.toml twice" % entry["name"]
        entries[entry["name"]] = entry
    missing = sorted(all_types - set(entries))
    assert not missing, "BaseCommand types missing from docs/compatibility.toml: %s" % missing
    unknown = sorted(set(entries) - all_types)
    assert not unknown, "compatibility.toml names commands the .proto does not have: %s" % unknown
    wrong = ["%s is answered by the broker but marked \"not\"" % n
             for n in sorted(handled) if entries[n]["state"] == "not"]
    wrong += ["%s is refused as unsupported by the broker but marked %s" % (n, entries[n]["state"])
              for n in sorted(refused) if entries[n]["state"] != "not"]
    wrong += ["%s is marked %s but the broker neither answers nor sends it" % (n, e["state"])
              for n, e in sorted(entries.items())
              if e["state"] != "not" and n not in handled and n not in sent]
    assert not wrong, "\n".join(wrong)


def test_compatibility_matrix_features_are_well_formed():
    features = _matrix().get("feature", [])
    assert len(features) >= 20
    names = set()
    for entry in features:
        for field in ("name", "state", "note"):
            assert field in entry, "a [[feature]] entry without %s: %r" % (field, entry)
        assert entry["state"] in STATES, entry
        assert entry["name"] not in names, "feature %r twice" % entry["name"]
        names.add(entry["name"])


# ---------------------------------------------------------------------------------- the page
PAGE_HEADER = """# Compatibility with Apache Pulsar

<!-- generated from docs/compatibility.toml by
     `python3 tests/compat/test_docs.py --write-compatibility-page`; do not edit -->

What Magnetar answers of Pulsar's binary protocol and admin REST API, and which features and
client options work. This page mirrors one data file, `docs/compatibility.toml`, which
`tests/compat/test_docs.py` checks against the code: every admin route the admin crate registers
and every command the broker answers is listed, and nothing is marked supported that the code
does not have. **supported**: works as in Pulsar; **partly**: answered, but only part of it acts
(the note says which); **not**: not built.

Routes are written with `/persistent/`; each also exists with `/non-persistent/`. Pulsar's own
references are the [admin REST API](https://pulsar.apache.org/admin-rest-api/) and the
[binary protocol](https://pulsar.apache.org/docs/next/developing-binary-protocol/).
"""


def _cell(text):
    return text.replace("|", "\\|")


def render_compatibility_page(matrix=None):
    """The Markdown page of the matrix: features, admin routes, protocol commands."""
    matrix = matrix if matrix is not None else _matrix()
    lines = [PAGE_HEADER, "## Features and client options", "",
             "| feature | state | note |", "|---|---|---|"]
    for e in matrix.get("feature", []):
        lines.append("| %s | %s | %s |" % (_cell(e["name"]), e["state"], _cell(e["note"])))
    lines += ["", "## Admin REST API", "",
              "| method | route | pulsar-admin | state | note |", "|---|---|---|---|---|"]
    for e in matrix.get("admin", []):
        command = "`%s`" % e["pulsar_admin"] if e["pulsar_admin"] else ""
        lines.append("| %s | `%s` | %s | %s | %s |" % (
            ", ".join(m.strip() for m in e["method"].split("|")), e["route"], command,
            e["state"], _cell(e["note"])))
    lines += ["", "## Binary protocol commands", "", "| command | state | note |", "|---|---|---|"]
    for e in matrix.get("command", []):
        lines.append("| `%s` | %s | %s |" % (e["name"], e["state"], _cell(e["note"])))
    return "\n".join(lines) + "\n"


def test_compatibility_page_mirrors_the_data_file():
    with open(MATRIX_PAGE, encoding="utf-8") as f:
        page = f.read()
    assert page == render_compatibility_page(), (
        "docs/src/concepts/compatibility.md is not docs/compatibility.toml rendered: run "
        "`python3 tests/compat/test_docs.py --write-compatibility-page`")


# ---------------------------------------------------------------------------------- links
LINK = re.compile(r"(?<!\!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?")


def _markdown_without_code(text):
    text = re.sub(r"(?ms)^(```|~~~).*?^\1[^\n]*$", "", text)
    return re.sub(r"`[^`\n]*`", "", text)


def _relative_targets(path):
    text = _markdown_without_code(_read(path))
    for m in list(LINK.finditer(text)) + list(IMAGE.finditer(text)):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # external (http:, mailto:) or an anchor in the same page
        yield target


def _doc_pages():
    pages = []
    for base, _, files in os.walk(DOCS_SRC):
        pages += [os.path.join(base, f) for f in files if f.endswith(".md")]
    return sorted(pages)


def test_internal_links():
    pages = _doc_pages()
    assert len(pages) >= 10, "docs/src has only %d pages" % len(pages)
    broken = []
    for page in pages + [os.path.join(REPO_ROOT, "README.md")]:
        for target in _relative_targets(page):
            if target.startswith("/"):
                broken.append("%s: %s (links must be relative)" % (os.path.relpath(page, REPO_ROOT), target))
                continue
            file_part = target.split("#", 1)[0]
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), file_part))
            if not os.path.exists(resolved):
                broken.append("%s: %s" % (os.path.relpath(page, REPO_ROOT), target))
    assert not broken, "broken relative links:\n" + "\n".join(broken)

    summary = os.path.join(DOCS_SRC, "SUMMARY.md")
    listed = set()
    for target in _relative_targets(summary):
        resolved = os.path.normpath(os.path.join(DOCS_SRC, target.split("#", 1)[0]))
        assert os.path.isfile(resolved), "SUMMARY.md lists %s, which does not exist" % target
        listed.add(resolved)
    unlisted = [os.path.relpath(p, DOCS_SRC) for p in pages
                if p != summary and os.path.normpath(p) not in listed]
    assert not unlisted, "pages under docs/src that SUMMARY.md does not list: %s" % unlisted


RUNNABLE_BLOCK = re.compile(r"^```sh,runnable\n(.*?)^```", re.MULTILINE | re.DOTALL)
MIN_RUNNABLE = 3


def test_runnable_blocks_run_as_written():
    binary = os.path.join(REPO_ROOT, "target", "release", "magnetar")
    assert os.access(binary, os.X_OK), "build it first: cargo build --release -p magnetar"
    import subprocess
    blocks = []
    for page in _doc_pages():
        with open(page, encoding="utf-8") as f:
            blocks += [(os.path.relpath(page, REPO_ROOT), b) for b in RUNNABLE_BLOCK.findall(f.read())]
    assert len(blocks) >= MIN_RUNNABLE, "only %d runnable blocks found" % len(blocks)
    for page, block in blocks:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, "%s: block failed (exit %d)\n%s\n%s%s" % (
            page, done.returncode, block, done.stdout[-2000:], done.stderr[-2000:])


SYSTEMD_DIR = os.path.join(REPO_ROOT, "deploy", "systemd")


def test_systemd_units_pass_only_flags_the_binary_takes():
    binary = os.path.join(REPO_ROOT, "target", "release", "magnetar")
    assert os.access(binary, os.X_OK), "build it first: cargo build --release -p magnetar"
    import subprocess
    units = sorted(f for f in os.listdir(SYSTEMD_DIR) if f.endswith(".service"))
    assert len(units) >= 2, units
    for unit in units:
        with open(os.path.join(SYSTEMD_DIR, unit), encoding="utf-8") as f:
            text = f.read().replace("\\\n", " ")
        exec_start = re.search(r"^ExecStart=\S*magnetar (\S+)(.*)$", text, re.M)
        assert exec_start, "%s: no ExecStart running magnetar" % unit
        subcommand, arguments = exec_start.group(1), exec_start.group(2)
        help_text = subprocess.run([binary, subcommand, "--help"], capture_output=True, text=True,
                                   timeout=30, check=True).stdout
        known = set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z-]*)", help_text, re.M))
        used = re.findall(r"(--[a-z][a-z-]*)", arguments)
        assert used, "%s passes no flags" % unit
        unknown = [flag for flag in used if flag not in known]
        assert not unknown, "%s: magnetar %s takes no %s" % (unit, subcommand, unknown)


if __name__ == "__main__":
    import sys
    if sys.argv[1:] != ["--write-compatibility-page"]:
        sys.exit("usage: python3 tests/compat/test_docs.py --write-compatibility-page")
    with open(MATRIX_PAGE, "w", encoding="utf-8") as f:
        f.write(render_compatibility_page())
    print("wrote", os.path.relpath(MATRIX_PAGE, REPO_ROOT))
