package meter

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// AppendJSON appends ev as JSON, the same document encoding/json makes of
// it (field for field; strings may escape differently but decode the
// same), without reflection and without allocating: the request path
// encodes one event per call.
func (ev *Event) AppendJSON(b []byte) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, ev.ID)
	b = append(b, `,"time":"`...)
	b = ev.Time.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","account":`...)
	b = appendJSONString(b, ev.Account)
	b = append(b, `,"key_id":`...)
	b = appendJSONString(b, ev.KeyID)
	b = append(b, `,"endpoint":`...)
	b = appendJSONString(b, ev.Endpoint)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, ev.Model)
	b = append(b, `,"upstream":`...)
	b = appendJSONString(b, ev.Upstream)
	b = append(b, `,"prompt_tokens":`...)
	b = strconv.AppendInt(b, ev.PromptTokens, 10)
	b = append(b, `,"cached_tokens":`...)
	b = strconv.AppendInt(b, ev.CachedTokens, 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, ev.CompletionTokens, 10)
	b = append(b, `,"reasoning_tokens":`...)
	b = strconv.AppendInt(b, ev.ReasoningTokens, 10)
	if ev.Images != 0 {
		b = append(b, `,"images":`...)
		b = strconv.AppendInt(b, ev.Images, 10)
	}
	b = append(b, `,"cost_nanos":`...)
	b = strconv.AppendInt(b, int64(ev.CostNanos), 10)
	b = append(b, `,"usage_source":`...)
	b = appendJSONString(b, string(ev.UsageSource))
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(ev.Status), 10)
	b = append(b, `,"latency_ns":`...)
	b = strconv.AppendInt(b, int64(ev.Latency), 10)
	b = append(b, `,"ttfb_ns":`...)
	b = strconv.AppendInt(b, int64(ev.TTFB), 10)
	b = append(b, `,"stream":`...)
	b = strconv.AppendBool(b, ev.Stream)
	if ev.JobID != "" {
		b = append(b, `,"job_id":`...)
		b = appendJSONString(b, ev.JobID)
	}
	if ev.Log != nil {
		b = append(b, `,"log":{"request":`...)
		b = appendJSONString(b, ev.Log.Request)
		b = append(b, `,"response":`...)
		b = appendJSONString(b, ev.Log.Response)
		b = append(b, `,"retention_days":`...)
		b = strconv.AppendInt(b, int64(ev.Log.RetentionDays), 10)
		b = append(b, '}')
	}
	return append(b, '}')
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string. Invalid UTF-8 becomes
// U+FFFD, as encoding/json does; U+2028 and U+2029 are escaped so the
// document is also valid JavaScript.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			switch r {
			case '\u2028':
				b = append(b, `\u2028`...)
			case '\u2029':
				b = append(b, `\u2029`...)
			default:
				b = append(b, `\ufffd`...)
			}
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
