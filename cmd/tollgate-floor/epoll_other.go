//go:build !linux

package main

import (
	"errors"
	"net"
)

func serveEpoll(net.Listener, string) error { return errors.New("-mode epoll needs Linux") }
