package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// maxCreationsRead bounds the markers a refused creation reads to say how
// long to wait; past it (a limit lowered far below what an account made)
// the wait said is the whole window, which is never too short.
const maxCreationsRead = 100

// CreationWindow is the span the creation limits count over: they are
// limits per hour.
const CreationWindow = time.Hour

// CreationLog counts what each account made in the last window, shared by
// every process on the NATS: one empty message per thing made, on the
// account's subject of a stream that drops messages older than the
// window. Counting is one stream info request (the stream keeps a count
// per subject), never a walk over what the account made, and survives
// restarts. What is made is counted by the process making it, before it
// is made: a creation that fails after still counts, and creations of one
// account racing one another through several processes can pass the limit
// by the number in flight.
type CreationLog struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	prefix string
	window time.Duration
}

// EnsureCreationLog declares the stream name over subjects prefix +
// account (idempotent, as EnsureStream) and returns its log. window 0 is
// CreationWindow; tests shorten it.
func EnsureCreationLog(ctx context.Context, js jetstream.JetStream, name, description, prefix string, replicas int, window time.Duration) (*CreationLog, error) {
	if window <= 0 {
		window = CreationWindow
	}
	st, err := EnsureStream(ctx, js, jetstream.StreamConfig{
		Name: name, Description: description, Subjects: []string{prefix + ">"},
		MaxAge: window, Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, err
	}
	return &CreationLog{js: js, stream: st, prefix: prefix, window: window}, nil
}

// Window is the span the log counts over.
func (l *CreationLog) Window() time.Duration { return l.window }

// Take counts one creation of account, unless the account made limit or
// more in the window: then it counts nothing, and wait is how long until
// the oldest of them leaves the window (at least a second), made the
// number counted. limit <= 0 is no limit, and counts nothing.
func (l *CreationLog) Take(ctx context.Context, account string, limit int) (made int, wait time.Duration, err error) {
	if limit <= 0 {
		return 0, 0, nil
	}
	subject := l.prefix + account
	info, err := l.stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, 0, fmt.Errorf("counting what %s made in the last %s: %w", account, l.window, err)
	}
	made = int(info.State.Subjects[subject])
	if made < limit {
		if _, err := l.js.Publish(ctx, subject, nil); err != nil {
			return 0, 0, fmt.Errorf("counting a creation of %s: %w", account, err)
		}
		return made + 1, 0, nil
	}
	// The next creation is allowed once made-limit+1 of them have left the
	// window: the wait is the age of that one, not of the oldest, which
	// said "in 2 seconds" to an account past a limit lowered by a reload
	// (or passed by racing creations) and refused it again then.
	wait = l.window
	if leaving := made - limit + 1; leaving <= maxCreationsRead {
		seq := uint64(1)
		for i := 0; i < leaving; i++ {
			msg, err := l.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				wait = 0 // left the window meanwhile
				break
			}
			if err != nil {
				return 0, 0, fmt.Errorf("reading the creations of %s: %w", account, err)
			}
			seq = msg.Sequence + 1
			// The stream drops a message a moment after it is window old.
			wait = time.Until(msg.Time.Add(l.window))
		}
	}
	return made, max(wait, time.Second), nil
}
