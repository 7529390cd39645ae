"""What a client may run: command patterns, environment rules, request sizes."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from ..defaults import DEFAULT_MAX_ARGV_BYTES, DEFAULT_MAX_CWD_BYTES, DEFAULT_MAX_ENV_BYTES
from ..errors import ErrorCode, RequestError
from ..protocol.messages import Open

# Variables that make a restricted command load code of the client's choosing.
LOADER_VARIABLES = re.compile(
    r"^(LD_.*|DYLD_.*|PYTHON.*|PERL5.*|PERLLIB|RUBY.*|NODE_.*|BASH_ENV|ENV|SHELLOPTS|BASHOPTS"
    r"|IFS|PATH|GCONV_PATH|LOCPATH|MALLOC_.*|GLIBC_TUNABLES|JAVA_TOOL_OPTIONS|_JAVA_OPTIONS"
    r"|LUA_.*|TCLLIBPATH|GIT_.*|PS4|PROMPT_COMMAND)$"
)




@dataclass(frozen=True)
class Policy:
    """The server's rules for `open`. Empty `allow_command` means any command."""

    allow_command: list[str] = field(default_factory=list)
    allow_env: list[str] = field(default_factory=list)
    max_argv_bytes: int = DEFAULT_MAX_ARGV_BYTES
    max_env_bytes: int = DEFAULT_MAX_ENV_BYTES
    max_cwd_bytes: int = DEFAULT_MAX_CWD_BYTES

    def check(self, request: Open) -> None:
        """Raise RequestError (`bad_request` for sizes, `forbidden` for policy)."""
        argv_bytes = sum(len(a.encode()) + 1 for a in request.argv)
        if argv_bytes > self.max_argv_bytes:
            raise RequestError(ErrorCode.BAD_REQUEST,
                               f"argv is {argv_bytes} bytes; the limit is {self.max_argv_bytes}")
        env_bytes = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in request.env.items())
        if env_bytes > self.max_env_bytes:
            raise RequestError(ErrorCode.BAD_REQUEST,
                               f"env is {env_bytes} bytes; the limit is {self.max_env_bytes}")
        if request.cwd is not None and len(request.cwd.encode()) > self.max_cwd_bytes:
            raise RequestError(ErrorCode.BAD_REQUEST,
                               f"cwd is longer than {self.max_cwd_bytes} bytes")
        for key, value in request.env.items():
            if not key or "=" in key or "\0" in key or "\0" in value:
                raise RequestError(ErrorCode.BAD_REQUEST, f"env name {key!r} is not valid")
        if any("\0" in arg for arg in request.argv) or "\0" in (request.cwd or ""):
            raise RequestError(ErrorCode.BAD_REQUEST, "argv and cwd may not contain NUL")
        if not self.allow_command:
            return
        if request.argv and not any(fnmatch.fnmatchcase(request.argv[0], pattern)
                                    for pattern in self.allow_command):
            raise RequestError(ErrorCode.FORBIDDEN,
                               f"command {request.argv[0]!r} is not allowed on this server")
        for key in request.env:
            if LOADER_VARIABLES.match(key):
                raise RequestError(ErrorCode.FORBIDDEN,
                                   f"env {key!r} is not allowed with restricted commands")
            if not any(fnmatch.fnmatchcase(key, pattern) for pattern in self.allow_env):
                raise RequestError(ErrorCode.FORBIDDEN, f"env {key!r} is not in --allow-env")
