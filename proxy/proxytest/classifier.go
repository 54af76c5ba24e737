package proxytest

import (
	"encoding/json"
	"strconv"

	"github.com/tidwall/gjson"
)

// proseAnswer replaces the first BadAnswerTimes replies: what a model says
// when it ignores the format it was asked for.
const proseAnswer = "Sure! The text looks fine to me."

// reply lets Options.Reply answer a non-stream chat request, or reports
// false when it declines.
func (s *Server) reply(js string, st *rendered, v *values) ([]byte, bool) {
	content, logprobs, ok := st.opts.Reply([]byte(js))
	if !ok {
		return nil, false
	}
	if st.replies.Add(1) <= int64(st.opts.BadAnswerTimes) {
		content, logprobs = proseAnswer, nil
		if gjson.Get(js, "logprobs").Type == gjson.True {
			logprobs = []byte(`[{"token":` + quote(proseAnswer) + `,"logprob":-0.0001,"top_logprobs":[]}]`)
		}
	}
	if st.opts.NoLogprobs || gjson.Get(js, "logprobs").Type != gjson.True || !gjson.ValidBytes(logprobs) {
		logprobs = nil
	}
	return renderReplyBody(st.opts, v, content, logprobs), true
}

func quote(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}

// renderReplyBody writes a chat.completion with content and, when logprobs
// is not nil, choices[0].logprobs.content set to it.
func renderReplyBody(o Options, v *values, content string, logprobs []byte) []byte {
	b := make([]byte, 0, 512+len(content)+len(logprobs))
	b = append(b, `{"id":"`...)
	b = append(b, v.id...)
	b = append(b, `","object":"chat.completion","created":`...)
	b = append(b, v.created...)
	b = append(b, `,"model":`...)
	b = append(b, v.model...)
	b = append(b, `,"system_fingerprint":null,"choices":[{"index":0,"message":{"role":"assistant","content":`...)
	b = append(b, quote(content)...)
	b = append(b, `,"refusal":null},"logprobs":`...)
	if logprobs != nil {
		b = append(b, `{"content":`...)
		b = append(b, logprobs...)
		b = append(b, `,"refusal":null}`...)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"finish_reason":"stop"}]`...)
	if !o.OmitUsage {
		b = append(b, `,"usage":`...)
		b = append(b, chatUsage(o)...)
	}
	return append(b, '}')
}

// AppendTokenLogprob writes one entry of OpenAI's logprobs.content array,
// {"token":…,"logprob":…,"bytes":[…],"top_logprobs":[…]}, for Reply
// functions; top is the alternatives, each a token and its logprob.
func AppendTokenLogprob(b []byte, token string, logprob float64, top []TopLogprob) []byte {
	b = appendLogprob(b, token, logprob)
	b = b[:len(b)-1] // reopen the object for top_logprobs
	b = append(b, `,"top_logprobs":[`...)
	for i, a := range top {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendLogprob(b, a.Token, a.Logprob)
	}
	return append(b, "]}"...)
}

// TopLogprob is one alternative of a token.
type TopLogprob struct {
	Token   string
	Logprob float64
}

func appendLogprob(b []byte, token string, logprob float64) []byte {
	b = append(b, `{"token":`...)
	b = append(b, quote(token)...)
	b = append(b, `,"logprob":`...)
	b = strconv.AppendFloat(b, logprob, 'g', -1, 64)
	b = append(b, `,"bytes":[`...)
	for i := 0; i < len(token); i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(token[i]), 10)
	}
	return append(b, "]}"...)
}
