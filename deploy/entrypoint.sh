#!/bin/sh
# The image's entrypoint: `constraintd` with the given arguments, started with umask 0007 so the Unix socket
# it creates is owner- and group-writable (connecting to a Unix socket needs write permission on it): any
# container that shares the pod's fsGroup may connect, other users may not. CONSTRAINTD_UMASK overrides it.
umask "${CONSTRAINTD_UMASK:-0007}"
exec /opt/constraintd/bin/constraintd "$@"
