//go:build !linux

package rawconn

import "net"

// Wrap returns c: raw system calls are used on Linux only.
func Wrap(c net.Conn) net.Conn { return c }

// PeerClosed is false: it looks at the socket on Linux only.
func PeerClosed(net.Conn) bool { return false }

// Quiet is true: it looks at the socket on Linux only.
func Quiet(net.Conn) bool { return true }

// limitUnsent does nothing: TCP_NOTSENT_LOWAT is set on Linux only.
func limitUnsent(net.Conn) {}

// counted has a capped Listener's c free its place when it is closed.
func counted(c net.Conn, conns *connCap) net.Conn {
	return &countedConn{Conn: c, place: capPlace{conns: conns}}
}
