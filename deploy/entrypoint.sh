#!/bin/sh
# The image's entrypoint: `constraintd` with the given arguments, under umask 0007 (CONSTRAINTD_UMASK overrides
# it), so what it writes (the vocabulary cache) is owner- and group-writable.
# `serve` gets its Unix socket's mode from the same umask: read and write for what the umask leaves of
# owner, group and others (0660 under 0007; connecting to a Unix socket needs write permission on it), so
# any container that shares the pod's fsGroup may connect and other users may not. CONSTRAINTD_SOCKET_MODE
# sets it instead, and a --socket-mode among the arguments wins over both (it comes later).
umask "${CONSTRAINTD_UMASK:-0007}"
if [ "$1" = serve ]; then
  shift
  mode="${CONSTRAINTD_SOCKET_MODE:-$(printf '%04o' $(( 0666 & ~0$(umask) )))}"
  exec /opt/constraintd/bin/constraintd serve --socket-mode "$mode" "$@"
fi
exec /opt/constraintd/bin/constraintd "$@"
