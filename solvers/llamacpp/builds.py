"""Which llama.cpp build a plan is for: its expert-cache policy and the cache flags it takes.

`parse_build(text)` reads `--llamacpp-version` in any of three forms:

- a build, `bNNNNN` (the nightly tags of ggml-org/llama.cpp, e.g. `b11669`);
- a release tag, `vX.Y.Z` (semantic versions, from v0.1.x on);
- the first line `llama-server --version` prints. Read from llama.cpp 0c1e5709 (vendored in
  llama-cpp-python 0.3.36): `common/arg.cpp` `--version` calls `llama_print_build_info`
  (`common/build-info.cpp.in`), which prints `version: <llama_version()> (build <N>, commit
  <hash>)`, llama_version() being `X.Y.Z` or `X.Y.Z-dev` (CMakeLists.txt `LLAMA_VERSION`);
  builds before the semantic versions printed `version: <N> (<hash>)`. Either is accepted;
  the build number is what decides.

What each build runs (the rules and where they were read: docs/llamacpp.md):

- before b11480: no expert cache, none of its flags;
- b11480 .. b12169: one LRU per group (solvers/llamacpp/lru.py), `--moe-cache-mib`;
- b12170 and later: ClassLRU (solvers/llamacpp/classlru.py), `--moe-cache-mib` and
  `--moe-cache-cpu-share`.

b11480 added the cache (#29887, its release page); b12170 made it ClassLRU (#31233, its
release page). `--moe-cache-cpu-share` came with v1.0.0 (#30966: the v1.0.0 release notes,
"add moe_cache_size and moe_cache_cpu_share to llama_context_params"). **Not knowable here:**
which build number v1.0.0 is (its page names commit b1b770d, not a build) or which build
merged #30966. The reading chosen: the CPU share from b12170 on. Evidence: the vendored
`llama-moe-cache.h` of the llama-cpp-sys-4 0.8 crate ("keeps the most recently used
experts", LRU) has no cpu_share, that of llama-cpp-native 0.32 ("recently and repeatedly
used", ClassLRU) has it, and `docs/moe-cache.md` at b12191 documents it. A build between
#30966 and b12170 therefore gets the flag refused; name b12170 or later to use it.

Release tags map to builds where the tag's page names its build (v0.1.2: "Nightly build:
b10485"); v1.0.0 and later are read as the newest policy with the CPU share (v1.0.0 ships
the share; the reading above puts it with ClassLRU); any other v0.x tag has no build known
here and is refused with a one-line error asking for the build number.

`--moe-cache-cpu-share`'s pinning companion, `-lm none|mlock|dio` (`--load-mode`), is older
than the cache (it is in 0c1e5709, which has no cache), so every build with the cache has it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from solvers.errors import SolverError

CACHE_FROM = 11480         # b11480: the expert cache (#29887)
CLASSLRU_FROM = 12170      # b12170: ClassLRU (#31233)
CPU_SHARE_FROM = 12170     # the reading chosen for v1.0.0's --moe-cache-cpu-share (docstring)
NEWEST = "b12191"          # the newest build whose cache rules were read (docs/moe-cache.md)
CACHE_FLAG = "--moe-cache-mib"
SHARE_FLAG = "--moe-cache-cpu-share"
RELEASE_BUILDS = {(0, 1, 2): 10485}   # the tag's release page: "Nightly build: b10485"
FIRST_WITH_SHARE = (1, 0, 0)

_BUILD = re.compile(r"^b(\d{1,7})$")
_TAG = re.compile(r"^v(\d{1,4})\.(\d{1,4})\.(\d{1,4})$")
_NEW_LINE = re.compile(r"^version:\s*(\S+)\s+\(build\s+(\d{1,7}),\s*commit\s+([0-9A-Za-z]+)\)")
_OLD_LINE = re.compile(r"^version:\s*(\d{1,7})\s+\(([0-9A-Za-z]+)\)")


@dataclass(frozen=True)
class Build:
    """A llama.cpp build as the planner needs it.

    given:    what the user gave (`--llamacpp-version`), "" when defaulted;
    number:   its build number (None: a release tag whose build is not known here);
    release:  `vX.Y.Z` where one was given or printed, else None;
    policy:   "none" (no expert cache), "lru" or "classlru";
    flags:    the cache flags it takes, in CACHE_FLAG, SHARE_FLAG order;
    assumed:  True when no version was given (the newest policy known)."""

    given: str
    number: int | None
    release: str | None
    policy: str
    flags: tuple[str, ...]
    assumed: bool = False

    @property
    def has_cache(self) -> bool:
        return CACHE_FLAG in self.flags

    @property
    def has_cpu_share(self) -> bool:
        return SHARE_FLAG in self.flags

    @property
    def name(self) -> str:
        """`b12191`, `v1.0.0` or both."""
        parts = [f"b{self.number}"] if self.number is not None else []
        return " ".join(parts + ([self.release] if self.release else []))

    @property
    def label(self) -> str:
        """How output names it, e.g. "llama.cpp b12191 (ClassLRU cache, CPU share; assumed:
        the newest policy known, give --llamacpp-version)"."""
        policy = {"none": "no expert cache", "lru": "LRU cache",
                  "classlru": "ClassLRU cache"}[self.policy]
        share = ", CPU share" if self.has_cpu_share else ""
        assumed = ("; assumed: the newest policy known, give --llamacpp-version"
                   if self.assumed else "")
        return f"llama.cpp {self.name} ({policy}{share}{assumed})"

    @property
    def cache(self) -> type:
        """The cache class that replays this build's policy (LlamaCppCache for "none" too:
        a build without the cache is never given one). Imported here: numba only where a
        cache is replayed."""
        from solvers.llamacpp.classlru import ClassLruCache
        from solvers.llamacpp.lru import LlamaCppCache

        return ClassLruCache if self.policy == "classlru" else LlamaCppCache

    def to_json(self) -> dict:
        return {"given": self.given, "number": self.number, "release": self.release,
                "policy": self.policy, "flags": list(self.flags), "assumed": self.assumed}


def of_number(number: int, given: str, release: str | None = None) -> Build:
    """The Build of build number `number`."""
    if number < CACHE_FROM:
        return Build(given, number, release, "none", ())
    policy = "classlru" if number >= CLASSLRU_FROM else "lru"
    flags = (CACHE_FLAG, SHARE_FLAG) if number >= CPU_SHARE_FROM else (CACHE_FLAG,)
    return Build(given, number, release, policy, flags)


def default_build() -> Build:
    """No version given: the newest policy known (NEWEST), marked assumed."""
    newest = of_number(int(NEWEST[1:]), "")
    return Build("", newest.number, None, newest.policy, newest.flags, assumed=True)


def parse_build(text: str | None, what: str = "--llamacpp-version") -> Build:
    """The Build `--llamacpp-version` names (module docstring); None or "": default_build().
    SolverError, one line naming `what` (where the text came from), for text that is none of
    the three forms."""
    if text is None or not text.strip():
        return default_build()
    given = text.strip().splitlines()[0].strip()
    if len(given) > 200:
        raise SolverError(f"{what}: expected bNNNNN, vX.Y.Z or the first line of "
                          "`llama-server --version`, got 200+ characters")
    if m := _BUILD.match(given):
        return of_number(int(m.group(1)), given)
    if m := _NEW_LINE.match(given):
        tag = m.group(1).removesuffix("-dev")
        number = int(m.group(2))
        release = f"v{tag}" if _TAG.match(f"v{tag}") else None
        if number > 0:
            return of_number(number, given, release)
        if release is None:  # a build from a source archive prints build 0
            raise SolverError(f"{what}: {given!r} names build 0 and no release: "
                              "give the build (bNNNNN) it was made from")
        return _of_release(release, given, what)
    if m := _OLD_LINE.match(given):
        return of_number(int(m.group(1)), given)
    if _TAG.match(given):
        return _of_release(given, given, what)
    raise SolverError(f"{what}: expected bNNNNN (a build), vX.Y.Z (a release) or "
                      f"the first line of `llama-server --version` "
                      f"(\"version: X.Y.Z (build N, commit H)\"), got {given[:80]!r}")


def _of_release(tag: str, given: str, what: str) -> Build:
    m = _TAG.match(tag)
    assert m is not None
    version = tuple(int(x) for x in m.groups())
    if version in RELEASE_BUILDS:
        return of_number(RELEASE_BUILDS[version], given, tag)
    if version >= FIRST_WITH_SHARE:
        newest = of_number(int(NEWEST[1:]), given)
        return Build(given, None, tag, newest.policy, newest.flags)
    raise SolverError(f"{what}: llama.cpp {tag}'s build number is not known to "
                      f"placer; give its build (bNNNNN: the `build N` that `llama-server "
                      f"--version` prints)")


def build_from_json(d: object) -> Build:
    """A plan's recorded build (Build.to_json), re-derived from what was given so a plan
    cannot claim flags its build lacks; a plan without one: default_build()."""
    if d is None:
        return default_build()
    if not isinstance(d, dict) or not isinstance(d.get("given", ""), str):
        raise SolverError("engine.llamacpp_build: expected an object with \"given\" (the "
                          "--llamacpp-version text)")
    return parse_build(d.get("given") or None, "the plan's engine.llamacpp_build.given")
