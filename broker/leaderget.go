package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrLeaderUnavailable is wrapped by LeaderGet's error when the bucket's
// stream leader did not answer (an election after a node was lost, or
// the request timed out): the key may well exist, so the caller answers
// "try again", never "not found".
var ErrLeaderUnavailable = errors.New("the bucket's stream leader did not answer")

// jsErrCodeMessageNotFound is the JetStream API's error code for a get
// that found no message.
const jsErrCodeMessageNotFound = 10037

// LeaderGet reads key of kv as its stream leader holds it: a miss of
// kv.Get confirmed. A get on a replicated bucket is a direct get, which
// any replica answers, a few milliseconds behind the leader: a job or a
// sign-in link written through one gateway was "not found" when asked for
// at once through another (a cluster test: a few in 40). STREAM.MSG.GET,
// unlike DIRECT.GET, is answered by the stream leader only. A key not
// there, deleted or purged is jetstream.ErrKeyNotFound; no answer is
// ErrLeaderUnavailable. The entry's Delta is 0 and its Operation a put.
func LeaderGet(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string) (jetstream.KeyValueEntry, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, js.Options().DefaultTimeout)
		defer cancel()
	}
	bucket := kv.Bucket()
	req, err := json.Marshal(struct {
		LastBySubject string `json:"last_by_subj"`
	}{"$KV." + bucket + "." + key})
	if err != nil {
		return nil, err
	}
	msg, err := js.Conn().RequestWithContext(ctx, apiPrefix(js)+"STREAM.MSG.GET.KV_"+bucket, req)
	if err != nil {
		return nil, fmt.Errorf("%w: reading %s of kv bucket %s: %w", ErrLeaderUnavailable, key, bucket, err)
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrorCode   int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Message *struct {
			Sequence uint64    `json:"seq"`
			Header   []byte    `json:"hdrs"`
			Data     []byte    `json:"data"`
			Time     time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, fmt.Errorf("reading %s of kv bucket %s: decoding the answer: %w", key, bucket, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jsErrCodeMessageNotFound:
		return nil, jetstream.ErrKeyNotFound
	case resp.Error != nil && resp.Error.Code == 503:
		return nil, fmt.Errorf("%w: reading %s of kv bucket %s: %s", ErrLeaderUnavailable, key, bucket, resp.Error.Description)
	case resp.Error != nil:
		return nil, fmt.Errorf("reading %s of kv bucket %s: %s (code %d)", key, bucket, resp.Error.Description, resp.Error.ErrorCode)
	case resp.Message == nil:
		return nil, fmt.Errorf("reading %s of kv bucket %s: an answer without the message", key, bucket)
	}
	if len(resp.Message.Header) > 0 {
		header, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if err != nil {
			return nil, fmt.Errorf("reading %s of kv bucket %s: decoding its headers: %w", key, bucket, err)
		}
		if op := header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
			return nil, jetstream.ErrKeyNotFound
		}
	}
	return &leaderEntry{bucket: bucket, key: key, value: resp.Message.Data,
		revision: resp.Message.Sequence, created: resp.Message.Time}, nil
}

// apiPrefix is the subject prefix js sends its API requests under.
func apiPrefix(js jetstream.JetStream) string {
	opts := js.Options()
	switch {
	case opts.Domain != "":
		return "$JS." + opts.Domain + ".API."
	case opts.APIPrefix != "":
		return strings.TrimSuffix(opts.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}

// leaderEntry is a KV entry read by LeaderGet.
type leaderEntry struct {
	bucket, key string
	value       []byte
	revision    uint64
	created     time.Time
}

func (e *leaderEntry) Bucket() string                  { return e.bucket }
func (e *leaderEntry) Key() string                     { return e.key }
func (e *leaderEntry) Value() []byte                   { return e.value }
func (e *leaderEntry) Revision() uint64                { return e.revision }
func (e *leaderEntry) Created() time.Time              { return e.created }
func (e *leaderEntry) Delta() uint64                   { return 0 }
func (e *leaderEntry) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePut }

// GetLatest reads key of kv as a reader that must not miss a write made a
// moment ago through another gateway expects: on a replicated bucket, a
// miss of the get, which any replica may answer, is asked of the stream
// leader (LeaderGet). With one replica the server that answered is the
// leader.
func GetLatest(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string, replicated bool) (jetstream.KeyValueEntry, error) {
	entry, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) && replicated {
		return LeaderGet(ctx, js, kv, key)
	}
	return entry, err
}
