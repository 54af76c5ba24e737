package proxy

// Usage: a call's tokens, from the upstream's report or estimated from
// the text, and the usage event that bills them.

import (
	"encoding/base64"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/catalog"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/loglimit"
	"github.com/tollgate/tollgate/internal/utf8cut"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/tokens"
)

// maxEstimateText bounds the text kept for estimating usage: a longer text
// is counted as it comes, this much at a time (see countKeptText).
const maxEstimateText = 4 << 20

// setUsage reads the chat (prompt/completion) or responses (input/output)
// spelling of usage, and reports whether it believed it. A report counts
// the output before it: the text kept for the estimate is dropped, and
// only output that comes after the last report is counted with the
// tokenizer and added to it (see event). An upstream that reported early
// in a stream (usage {10, 0} in its first chunk) had all the content
// after it relayed free.
//
// A report out of range is not believed: the call is billed on the
// report in range before or after it, or, with none, on the tokenizer's
// estimate, as if the upstream had sent none. A bad report is no later
// word on the usage than a good one. So is a zero the call contradicts
// (contradictedUsage).
func (c *generationCall) setUsage(u gjson.Result) bool {
	responses := c.ep == endpointResponses
	usage, refused := believedUsage(u, responses)
	zeroOutput := false
	if refused == "" {
		refused, zeroOutput = c.contradictedUsage(usage)
	}
	if refused != "" {
		// A report of no output after output may be an interim one too,
		// its count not yet updated: a later one may count it.
		interim := zeroOutput || interimUsage(u, responses)
		// Once a call: a stream may repeat it in every chunk. A report
		// worse than an interim one takes its place.
		if c.refusedUsage == "" || c.refusedInterim && !interim {
			// Quoted: the raw JSON may hold newlines, which split
			// the log line.
			c.refusedUsage = fmt.Sprintf("%s (%.300q)", refused, u.Raw)
			c.refusedInterim = interim
		}
		return false
	}
	if c.refusedInterim {
		// Gemini's stream reports the prompt alone in its early chunks
		// and the whole usage at its end: the early ones were logged and
		// counted as refused in every call, though the bill was exact.
		c.refusedUsage, c.refusedInterim = "", false
	}
	c.usage.PromptTokens, c.usage.CompletionTokens = usage.PromptTokens, usage.CompletionTokens
	c.usage.CachedTokens, c.usage.ReasoningTokens = usage.CachedTokens, usage.ReasoningTokens
	c.haveUsage = true
	c.reports++
	c.text, c.textTokens, c.rawChunks = c.text[:0], 0, c.rawChunks[:0]
	c.reasoning, c.reasoningTokens = c.reasoning[:0], 0
	return true
}

// upstreamLogEvery is how often, at most, the log repeats a line an
// upstream's every call would bring, after the first (a usage report not
// believed, bytes after an answer): such an upstream does it in every
// call, and each had its line (8,629 calls, 8,632 lines). Their counters
// (tollgate_upstream_usage_refused_total, _overruns_total) count each.
const upstreamLogEvery = 10 * time.Second

// logRefusedUsage counts the usage report not believed, if one came, and
// logs it with what the call is billed instead: a report in range, plus
// after tokens the tokenizer counted in the output after it, or the
// estimate. Logged for the upstream's first such call, then for at most
// one each upstreamLogEvery, saying how many calls were not logged.
func (c *generationCall) logRefusedUsage(after int64) {
	if c.refusedUsage == "" {
		return
	}
	c.upstream.health.usageRefused.Add(1)
	ok, held := c.upstream.refusedUsageLog.Allow(time.Now(), upstreamLogEvery)
	if !ok {
		return
	}
	instead := "the tokenizer's estimate instead"
	if c.haveUsage {
		instead = fmt.Sprintf("its report in range instead: %d prompt and %d completion tokens", c.usage.PromptTokens, c.usage.CompletionTokens)
		if after > 0 {
			instead += fmt.Sprintf(", and %d the tokenizer counted in the output after it", after)
		}
	}
	c.server.logf("proxy: call %s: upstream %s reported usage %s; billing %s%s", c.reqID, c.upstream.cfg.Name, c.refusedUsage, instead,
		loglimit.HeldNote(held, "calls since the last such line; see tollgate_upstream_usage_refused_total"))
}

// believedUsage reads an upstream's usage report: its counts, and why they
// are not believed ("" when they are): not both counts as numbers, or out
// of range.
func believedUsage(u gjson.Result, responses bool) (catalog.Usage, string) {
	parsed, reported := parseUsage(u, responses)
	usage, ok := checkUsage(parsed)
	switch {
	case !reported:
		return usage, "without a number of prompt and completion tokens"
	case !ok:
		return usage, "out of range"
	}
	return usage, ""
}

// contradictedUsage says why a report in range is not believed all the
// same ("" when it is): 0 prompt tokens for a request with a prompt, or 0
// completion tokens when output was relayed before the report (its text
// kept since the last report, or counted by that report), which
// zeroOutput tells apart. Believed, such a report billed a call of 20 words
// nothing. A zero with nothing against it (an empty answer, max_tokens 0)
// stands. The prompt is counted only for a report of 0 prompt tokens,
// and the output read only for a report of 0 completion tokens.
func (c *generationCall) contradictedUsage(usage catalog.Usage) (refused string, zeroOutput bool) {
	if usage.PromptTokens == 0 && c.countedPrompt() > 0 {
		return "out of range: 0 prompt tokens for a prompt", false
	}
	if usage.CompletionTokens != 0 {
		return "", false
	}
	if c.haveUsage && c.usage.CompletionTokens > 0 {
		return "out of range: 0 completion tokens after a report of some", true
	}
	c.textOfRawChunks()
	if len(c.text) > 0 || c.textTokens > 0 {
		return "out of range: 0 completion tokens for output relayed", true
	}
	return "", false
}

// countedPrompt is the tokenizer's count of the request's prompt and the
// history it continues, counted once.
func (c *generationCall) countedPrompt() int64 {
	if !c.promptCounted {
		c.promptTokens = int64(tokens.Count(promptText(*c.reqBody, c.ep))) + c.history
		c.promptCounted = true
	}
	return c.promptTokens
}

// maxReportedTokens bounds each count an upstream reports for one call:
// a hundred times the largest context window served today. It is
// config's, which refuses prices at which a call of that many tokens
// would cost more than billing takes for one event; a buggy or hostile
// upstream's 4e18 tokens once saturated the cost and voided the debits
// of every other call in its billing batch.
const maxReportedTokens = config.MaxReportedTokens

// checkUsage reports whether an upstream's counts are believable (none
// negative or above maxReportedTokens) and returns them with cached
// tokens no more than the prompt's and reasoning no more than the
// completion's, the parts they are of; out of range, the counts are
// clamped into it.
func checkUsage(u catalog.Usage) (catalog.Usage, bool) {
	ok := true
	clamp := func(n *int64) {
		if *n < 0 || *n > maxReportedTokens {
			ok = false
			*n = min(max(*n, 0), maxReportedTokens)
		}
	}
	clamp(&u.PromptTokens)
	clamp(&u.CompletionTokens)
	clamp(&u.CachedTokens)
	clamp(&u.ReasoningTokens)
	u.CachedTokens = min(u.CachedTokens, u.PromptTokens)
	u.ReasoningTokens = min(u.ReasoningTokens, u.CompletionTokens)
	return u, ok
}

// parseUsage reads an upstream's usage object in either dialect: chat's
// prompt and completion tokens, or responses' input and output tokens.
// With both, the endpoint's own is billed, the one its SDK shows.
// reported is false unless both counts are there as numbers: {} or
// {"total_tokens":5000} read as 0 and 0 were billed nothing, as counts
// from the upstream.
//
// Reasoning is part of the completion (OpenAI, vLLM) unless the total
// says otherwise: xAI and Gemini's OpenAI-compatible API report it apart,
// total = prompt + completion + reasoning, and checkUsage cut it to the
// completion, leaving it unbilled. It is added to the completion then.
func parseUsage(u gjson.Result, responses bool) (usage catalog.Usage, reported bool) {
	in, out, cached, reasoning := usageKeys(u, responses)
	var okIn, okOut bool
	usage.PromptTokens, okIn = tokenCount(u.Get(in))
	usage.CompletionTokens, okOut = tokenCount(u.Get(out))
	// The parts are optional: absent or unreadable, none are cached.
	var okCached bool
	usage.CachedTokens, okCached = tokenCount(u.Get(cached))
	if !okCached && in == "prompt_tokens" {
		// DeepSeek's spelling (checkUsage caps it at the prompt as it
		// does the other): unread, its cache hits were billed at the
		// full prompt price.
		usage.CachedTokens, _ = tokenCount(u.Get("prompt_cache_hit_tokens"))
	}
	usage.ReasoningTokens, _ = tokenCount(u.Get(reasoning))
	if reasoningApart(usage, u.Get("total_tokens")) {
		usage.CompletionTokens += usage.ReasoningTokens
	}
	return usage, okIn && okOut
}

// usageKeys names the members of u's counts in the dialect parseUsage
// reads: chat's prompt and completion tokens where u has them (but for a
// responses call whose u has its own), else responses' input and output
// tokens.
func usageKeys(u gjson.Result, responses bool) (in, out, cached, reasoning string) {
	if u.Get("prompt_tokens").Exists() && !(responses && u.Get("input_tokens").Exists()) {
		return "prompt_tokens", "completion_tokens", "prompt_tokens_details.cached_tokens", "completion_tokens_details.reasoning_tokens"
	}
	return "input_tokens", "output_tokens", "input_tokens_details.cached_tokens", "output_tokens_details.reasoning_tokens"
}

// reportsNoCompletion reports whether u counts 0 completion tokens, which
// a whole answer's text may contradict (contradictedUsage).
func reportsNoCompletion(u gjson.Result, responses bool) bool {
	_, out, _, _ := usageKeys(u, responses)
	n, ok := tokenCount(u.Get(out))
	return ok && n == 0
}

// interimUsage reports whether u, a report not believed, is a stream's
// interim one: the prompt's count in range and no completion count at
// all, as Gemini's early chunks carry.
func interimUsage(u gjson.Result, responses bool) bool {
	in, out, _, _ := usageKeys(u, responses)
	n, ok := tokenCount(u.Get(in))
	return ok && n >= 0 && n <= maxReportedTokens && !u.Get(out).Exists()
}

// reasoningApart reports whether total counts usage's reasoning apart from
// its completion: prompt + completion + reasoning, all in range (their sum
// cannot overflow then), and some reasoning.
func reasoningApart(usage catalog.Usage, total gjson.Result) bool {
	n, ok := tokenCount(total)
	inRange := func(n int64) bool { return n >= 0 && n <= maxReportedTokens }
	return ok && usage.ReasoningTokens > 0 && inRange(usage.PromptTokens) && inRange(usage.CompletionTokens) &&
		inRange(usage.ReasoningTokens) && n == usage.PromptTokens+usage.CompletionTokens+usage.ReasoningTokens
}

// tokenCount reads a count written as a JSON number or a string holding
// one; a fraction counts as a whole token. gjson's Int reads "abc" and
// " 1000" as 0.
func tokenCount(v gjson.Result) (int64, bool) {
	raw := v.Raw
	switch v.Type {
	case gjson.Number:
	case gjson.String:
		raw = v.Str
	default:
		return 0, false
	}
	if n, err := strconv.ParseInt(raw, 10, 64); err == nil {
		return n, true
	}
	f, err := strconv.ParseFloat(raw, 64)
	if err != nil || math.IsNaN(f) {
		return 0, false
	}
	if f < 0 {
		// Rounded up, -0.5 became 0, believed: a negative count is out
		// of range whatever its fraction.
		return -1, true
	}
	// Out of int64's range the count is far out of checkUsage's range too.
	return int64(min(math.Ceil(f), 1<<62)), true
}

// appendText takes text the answer forwarded: into a stream's log, and
// into the estimate of the output no usage report counted yet.
func (c *generationCall) appendText(s string) { c.appendOutput(s, false) }

// appendOutput is appendText for text that reported says a usage report
// that came with it counts already (vLLM's cumulative usage in every
// chunk): kept for the log only.
func (c *generationCall) appendOutput(s string, reported bool) {
	if c.logging.Enabled && c.stream {
		c.appendLogText(s)
	}
	if !reported {
		c.text = append(c.text, s...)
	}
}

// appendReasoning is appendOutput for reasoning text, which the estimate
// counts apart too, as the reasoning tokens of its completion: reported
// as 0, they hid from the client, and from the usage event, how much of
// an estimated completion was reasoning.
func (c *generationCall) appendReasoning(s string, reported bool) {
	c.appendOutput(s, reported)
	if !reported {
		c.reasoning = append(c.reasoning, s...)
	}
}

// appendLogText keeps s for a stream's log, as much of it as an event can
// carry (meter.MaxLogBytes), and counts the bytes left out, which the log's
// cut line reports. Once some are left out nothing more is kept: the log is
// the answer's start.
func (c *generationCall) appendLogText(s string) {
	keep := 0
	if c.logLeftOut == 0 {
		keep = len(utf8cut.Prefix(s, meter.MaxLogBytes-len(c.logText)))
	}
	if len(c.logText)+keep > cap(c.logText) {
		// Grown as append would, but never past the bound.
		grown := make([]byte, len(c.logText), min(max(2*cap(c.logText), len(c.logText)+keep), meter.MaxLogBytes))
		c.logText = append(grown[:0], c.logText...)
	}
	c.logText = append(c.logText, s[:keep]...)
	c.logLeftOut += int64(len(s) - keep)
}

// textMark is where the text kept for the estimate stood after an event.
type textMark struct {
	text, reasoning, rawChunks, logText, toolOutput           int
	textTokens, reasoningTokens, logLeftOut, toolOutputTokens int64
	rawChunksRead, reports                                    int
}

func (c *generationCall) markText() textMark {
	return textMark{len(c.text), len(c.reasoning), len(c.rawChunks), len(c.logText), len(c.toolOutput),
		c.textTokens, c.reasoningTokens, c.logLeftOut, c.toolOutputTokens, c.rawChunksRead, c.reports}
}

// forgetText drops the text kept since m: that of events the client never
// got, whose write failed. Text read from its chunks since (once every
// 4 MiB of them) stays in the estimate, at most one write's worth too
// many; none is counted before its write (countKeptText).
func (c *generationCall) forgetText(m textMark) {
	c.logText, c.logLeftOut = c.logText[:m.logText], m.logLeftOut
	if c.toolOutputTokens == m.toolOutputTokens {
		c.toolOutput = c.toolOutput[:m.toolOutput]
	}
	if c.reports != m.reports {
		// A usage report came in these events: all the text kept since
		// it came with them too.
		c.text, c.textTokens, c.rawChunks = c.text[:0], 0, c.rawChunks[:0]
		c.reasoning, c.reasoningTokens = c.reasoning[:0], 0
		return
	}
	if c.textTokens != m.textTokens || c.reasoningTokens != m.reasoningTokens || c.rawChunksRead != m.rawChunksRead {
		return
	}
	c.text, c.reasoning, c.rawChunks = c.text[:m.text], c.reasoning[:m.reasoning], c.rawChunks[:m.rawChunks]
}

// completionEstimate is the tokens of the text forwarded since the last
// usage report (all of it when none came), which bill the completion, or
// its part no report counted.
func (c *generationCall) completionEstimate() int64 {
	return c.textTokens + int64(tokens.Count(bstr(c.text)))
}

// reasoningEstimate is the tokens of the reasoning text among those
// completionEstimate counts, and no more than they: counted apart, a
// text's tokens may add up to one or two more than counted whole.
func (c *generationCall) reasoningEstimate(completion int64) int64 {
	if len(c.reasoning) == 0 && c.reasoningTokens == 0 {
		return 0
	}
	return min(c.reasoningTokens+int64(tokens.Count(bstr(c.reasoning))), completion)
}

// countKeptText counts the text kept for the estimate past
// maxEstimateText (see countPast), the answer's and its tools' output.
// The relay calls it once the events that brought the text are written,
// not as they are read: counting takes about 3 s per 4 MiB, and an event
// of 6 MiB of text reached the client seconds after the upstream sent it.
// So the text kept outgrows the bound by what the events of one write
// carry, at most one event's over maxCoalesced, which max_response_body
// bounds.
func (c *generationCall) countKeptText() {
	c.text, c.textTokens = countPast(c.text, c.textTokens, maxEstimateText)
	c.reasoning, c.reasoningTokens = countPast(c.reasoning, c.reasoningTokens, maxEstimateText)
	c.toolOutput, c.toolOutputTokens = countPast(c.toolOutput, c.toolOutputTokens, maxEstimateText)
}

// countPast counts text, the part of an answer's text not counted yet,
// after counted tokens of it were, down to limit bytes: up to a cut (see
// safeCut) in its first limit bytes, again until limit bytes or fewer
// are left. An answer of any length is counted in bounded memory:
// capped instead, a text of 5 MB was billed no completion tokens at all,
// and a stream the first 4 MiB of its text. A long answer without usage
// is counted while it is relayed, about 3 s per 4 MiB of text, a million
// tokens or so.
func countPast(text []byte, counted int64, limit int) ([]byte, int64) {
	for len(text) > limit {
		cut := safeCut(text[:limit])
		counted += int64(tokens.Count(bstr(text[:cut])))
		text = text[:copy(text, text[cut:])]
	}
	return text, counted
}

// safeCut returns where in text, past its first half, it can be cut so
// that the tokens of the two parts add up to those of the whole: before a
// space that follows anything but whitespace, or before anything but a
// letter, mark, digit or apostrophe that follows a letter or digit. No
// piece of o200k_base's split pattern spans such a point (a piece holds a
// space only first or among whitespace, and continues a word only with
// letters, marks, digits or a contraction), and none looks behind it. A
// text without one in its second half (a single word of megabytes) is cut
// after its last whole character, which may split a piece in two: two or
// three tokens more a cut (a re-test of one letter repeated: 4.5 MB
// counted 2 over, 9 MB 3 over).
func safeCut(text []byte) int {
	half := len(text) / 2
	for i := len(text) - 1; i > half; i-- {
		if pieceBoundary(text, i) {
			return i
		}
	}
	for i := len(text) - 1; i > half; i-- {
		if utf8.RuneStart(text[i]) {
			return i
		}
	}
	return len(text)
}

// pieceBoundary reports whether text[i] begins a piece of o200k_base's
// split pattern, whatever follows text (see safeCut).
func pieceBoundary(text []byte, i int) bool {
	if !utf8.RuneStart(text[i]) {
		return false
	}
	prev, _ := utf8.DecodeLastRune(text[:i])
	next, _ := utf8.DecodeRune(text[i:])
	// A character text ends inside of decodes as an error, not what it is.
	return next == ' ' && !unicode.IsSpace(prev) ||
		(unicode.IsLetter(prev) || unicode.IsNumber(prev)) && !continuesWord(next) && next != utf8.RuneError
}

// continuesWord reports whether r, after a letter or digit, may belong to
// the same piece of o200k_base's split pattern.
func continuesWord(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsNumber(r) || r == '\''
}

// readChoices notes a finish_reason and keeps the delta text for
// estimating, unless reported: the chunk's own usage report counts it
// (then its text is kept for the log alone, and read only for it).
func (c *generationCall) readChoices(choices gjson.Result, reported bool) {
	choices.ForEach(func(_, ch gjson.Result) bool {
		if fr := ch.Get("finish_reason"); fr.Type == gjson.String {
			c.finishChoice(ch.Get("index").Int())
			c.choiceFailed = c.choiceFailed || fr.Str == "error"
		} else {
			c.seeChoice(ch.Get("index").Int())
		}
		if !reported || c.logging.Enabled {
			d := ch.Get("delta")
			c.appendOutput(d.Get("content").Str, reported)
			c.appendReasoning(d.Get("reasoning_content").Str, reported)
			c.appendReasoning(d.Get("reasoning").Str, reported)
			// A refusal is generated text too: a stream of it was billed
			// no completion tokens when it came without usage.
			c.appendOutput(d.Get("refusal").Str, reported)
			c.appendToolCalls(d.Get("tool_calls"), reported)
		}
		return true
	})
}

// appendToolCalls keeps the names and arguments of tool calls, which are
// generated tokens like any text: a cut stream of tool calls was billed no
// completion tokens at all. reported is appendOutput's.
func (c *generationCall) appendToolCalls(calls gjson.Result, reported bool) {
	calls.ForEach(func(_, tc gjson.Result) bool {
		c.appendOutput(tc.Get("function.name").Str, reported)
		c.appendOutput(tc.Get("function.arguments").Str, reported)
		return true
	})
}

// outputItem is what the estimate holds of a Responses output item, the
// one at outputIndex. Of a tool call: whether its name was counted, and
// how many bytes of its input (a function's or MCP tool's arguments, a
// custom tool's input). Of a message or reasoning item: how many bytes of
// its text were counted (textCounted), and of the part under way (part,
// partCounted). An event that repeats them whole (the input's or a
// part's done, content_part.done, output_item.done) adds what was not
// counted yet: an upstream that sends text only there, no deltas, was
// billed none of it when its stream was cut. The kept text cannot tell:
// counted once every 4 MiB (see countPast), it no longer ends with
// what deltas delivered before the count, and that part was counted
// again.
type outputItem struct {
	outputIndex  int64
	named        bool
	inputCounted int
	textCounted  int
	part         textPart
	partCounted  int
}

// textPart names a part of a message or reasoning item's text: its
// content_index, or its summary_index in a reasoning item's summary.
type textPart struct {
	summary bool
	index   int64
}

// outputItemSlots is how many output items a stream's estimate follows
// at once: the items of OpenAI's streams come one after another, but an
// upstream may end them (output_item.done) after later ones began.
const outputItemSlots = 8

// outputItemAt is the output item at output index i: the one followed in
// its slot, or a new one where the slot held another.
func (c *generationCall) outputItemAt(i int64) *outputItem {
	t := &c.items[uint64(i)%outputItemSlots]
	if t.outputIndex != i {
		*t = outputItem{outputIndex: i}
	}
	return t
}

// appendPartText takes text of part p of the message or reasoning item at
// output index i: a delta, or, whole says, the part's whole text, of
// which only what its deltas did not bring is counted; reasoning says
// it is a reasoning item's.
func (c *generationCall) appendPartText(i int64, p textPart, text string, whole, reasoning bool) {
	t := c.outputItemAt(i)
	if t.part != p {
		t.part, t.partCounted = p, 0
	}
	if whole {
		if len(text) <= t.partCounted {
			return
		}
		text = text[t.partCounted:]
	}
	c.appendItemOutput(text, reasoning)
	t.partCounted += len(text)
	t.textCounted += len(text)
}

// appendItemText takes the text of a message or reasoning item that
// output_item.done or a whole answer carries, counting what its parts'
// deltas and done events did not: the item's text, part after part, past
// the bytes counted already.
func (c *generationCall) appendItemText(t *outputItem, item gjson.Result, reasoning bool) {
	skip := t.textCounted
	// A reasoning item's summary is generated text as its content is.
	for _, key := range [...]string{"content", "summary"} {
		item.Get(key).ForEach(func(_, part gjson.Result) bool {
			for _, text := range [...]string{part.Get("text").Str, part.Get("refusal").Str} { // a refusal part's text
				if skip >= len(text) {
					skip -= len(text)
					continue
				}
				c.appendItemOutput(text[skip:], reasoning)
				t.textCounted += len(text) - skip
				skip = 0
			}
			return true
		})
	}
}

// appendItemOutput takes text of a Responses output item, reasoning if
// the item is a reasoning one.
func (c *generationCall) appendItemOutput(s string, reasoning bool) {
	if reasoning {
		c.appendReasoning(s, false)
	} else {
		c.appendText(s)
	}
}

// appendToolInput takes a delta of the input of the tool call at output
// index i.
func (c *generationCall) appendToolInput(i int64, delta string) {
	t := c.outputItemAt(i)
	c.appendText(delta)
	t.inputCounted += len(delta)
}

// appendWholeToolCall takes the name and input of the tool call at output
// index i from an event that carries them whole ("" for what it leaves
// out), keeping what was not counted yet; added starts a new item.
func (c *generationCall) appendWholeToolCall(i int64, added bool, name, input string) {
	t := c.outputItemAt(i)
	if added {
		*t = outputItem{outputIndex: i}
	}
	if name != "" && !t.named {
		c.appendText(name)
		t.named = true
	}
	if len(input) > t.inputCounted {
		c.appendText(input[t.inputCounted:])
		t.inputCounted = len(input)
	}
}

// appendOutputItem takes the Responses output item at output index i, as
// output_item.added or output_item.done carries it or a whole answer
// holds it: a tool call's name and input and, once done, an MCP call's
// output, the tools an MCP server listed, and a message's or reasoning
// item's text.
func (c *generationCall) appendOutputItem(i int64, added bool, item gjson.Result) {
	typ := item.Get("type").Str
	if added {
		// Its text comes after, in deltas and done events; an added item
		// with text (none of OpenAI's) is counted once done.
		c.items[uint64(i)%outputItemSlots] = outputItem{outputIndex: i}
	} else {
		c.appendItemText(c.outputItemAt(i), item, typ == "reasoning")
	}
	if typ == "mcp_list_tools" {
		// The tool definitions the MCP server returned: the model reads
		// them as it reads a request's tools, so they are prompt, counted
		// once, from the done item (the added one has none yet).
		if tools := item.Get("tools"); !added && tools.IsArray() {
			c.appendToolOutput(tools.Raw)
		}
		return
	}
	key := toolInputKey(typ)
	if key == "" {
		return
	}
	c.appendWholeToolCall(i, added, item.Get("name").Str, item.Get(key).Str)
	if typ == "mcp_call" && !added {
		c.appendToolOutput(item.Get("output").Str)
		c.appendToolOutput(item.Get("error").Str)
	}
}

// toolInputKey is the member of a tool call's output item that holds the
// input the model wrote: a function's or MCP tool's arguments (those of
// an MCP call waiting for the client's approval too), a custom tool's
// free-form input, the code the model wrote for the code interpreter; ""
// for an item of another type.
func toolInputKey(itemType string) string {
	switch itemType {
	case "function_call", "mcp_call", "mcp_approval_request":
		return "arguments"
	case "custom_tool_call":
		return "input"
	case "code_interpreter_call":
		return "code"
	}
	return ""
}

// appendToolOutput keeps, until usage is known, what a tool the upstream
// ran (an MCP call) answered: the model reads it, and OpenAI bills it as
// input, so the estimate counts it as prompt, not completion.
func (c *generationCall) appendToolOutput(s string) {
	if !c.haveUsage {
		c.toolOutput = append(c.toolOutput, s...)
	}
}

// maxChoices is OpenAI's bound on n.
const maxChoices = 128

// finishChoice notes that choice i reached its finish_reason.
func (c *generationCall) finishChoice(i int64) {
	if i >= 0 && i < maxChoices {
		c.choiceDone[i/64] |= 1 << (i % 64)
	}
	c.seeChoice(i)
}

// seeChoice notes that choice i came in a chunk: the stream's content is
// finished once it, and every other choice that came or was asked for,
// has its finish_reason. An index out of the sets' range (none of
// OpenAI's: n is at most maxChoices) leaves the stream unfinished until
// [DONE]: cut without it, it is interrupted, since which choices it held
// is not known.
func (c *generationCall) seeChoice(i int64) {
	if i < 0 || i >= maxChoices {
		c.choiceBeyond = true
	} else {
		c.choiceSeen[i/64] |= 1 << (i % 64)
	}
	c.finished = c.doneSeen || c.endedByError || c.allChoicesFinished()
}

// allChoicesFinished reports whether every choice has its finish_reason:
// the first (a stream's only one, without n), each below the request's n,
// and each that came in a chunk.
func (c *generationCall) allChoicesFinished() bool {
	if c.choiceBeyond {
		return false
	}
	asked := max(c.choices, 1)
	for w := range c.choiceDone {
		want := c.choiceSeen[w]
		switch below := asked - 64*w; {
		case below >= 64:
			want = ^uint64(0)
		case below > 0:
			want |= 1<<below - 1
		}
		if want&^c.choiceDone[w] != 0 {
			return false
		}
	}
	return true
}

func (c *generationCall) collectWholeText(body []byte) {
	if c.ep == endpointChat {
		gjson.Get(bstr(body), "choices").ForEach(func(_, ch gjson.Result) bool {
			m := ch.Get("message")
			c.appendText(m.Get("content").Str)
			c.appendReasoning(m.Get("reasoning_content").Str, false)
			c.appendReasoning(m.Get("reasoning").Str, false)
			c.appendText(m.Get("refusal").Str)
			c.appendToolCalls(m.Get("tool_calls"), false)
			return true
		})
		return
	}
	var i int64 // the item's output index
	gjson.Get(bstr(body), "output").ForEach(func(_, item gjson.Result) bool {
		c.appendOutputItem(i, false, item)
		i++
		return true
	})
}

// recordAndWait records the call's event once and waits, bounded, until the
// meter has it safe from a crash (see meter.DurableRecorder), so the answer
// a client receives is billed even if the gateway is killed right after
// sending it.
func (c *generationCall) recordAndWait(status int) {
	c.waitRecorded(c.record(status))
}

// record records the call's event once. It returns a channel closed when
// the event is safe from a crash, or nil when there is nothing to wait for.
func (c *generationCall) record(status int) <-chan struct{} {
	if c.recorded {
		return nil
	}
	c.recorded = true
	ev := c.event(status)
	c.billed = catalog.Usage{PromptTokens: ev.PromptTokens, CachedTokens: ev.CachedTokens,
		CompletionTokens: ev.CompletionTokens, ReasoningTokens: ev.ReasoningTokens}
	if c.responseID != "" {
		c.server.responses.setTokens(c.responseID, ev.PromptTokens+ev.CompletionTokens)
	}
	c.server.calls.observeEvent(ev, c.interrupted)
	c.endCallSpan(ev)
	c.limit.charge(ev.PromptTokens + ev.CompletionTokens)
	c.server.noteCharge(ev)
	return meter.RecordSafe(c.server.recorder, ev)
}

// appendChatUsage writes u as a chat answer's usage object, in OpenAI's
// shape.
func appendChatUsage(dst []byte, u catalog.Usage) []byte {
	dst = strconv.AppendInt(append(dst, `{"prompt_tokens":`...), u.PromptTokens, 10)
	dst = strconv.AppendInt(append(dst, `,"completion_tokens":`...), u.CompletionTokens, 10)
	dst = strconv.AppendInt(append(dst, `,"total_tokens":`...), u.PromptTokens+u.CompletionTokens, 10)
	dst = strconv.AppendInt(append(dst, `,"prompt_tokens_details":{"cached_tokens":`...), u.CachedTokens, 10)
	dst = strconv.AppendInt(append(dst, `},"completion_tokens_details":{"reasoning_tokens":`...), u.ReasoningTokens, 10)
	return append(dst, "}}"...)
}

// appendResponsesUsage writes u as a response's usage object, in
// OpenAI's shape.
func appendResponsesUsage(dst []byte, u catalog.Usage) []byte {
	dst = strconv.AppendInt(append(dst, `{"input_tokens":`...), u.PromptTokens, 10)
	dst = strconv.AppendInt(append(dst, `,"input_tokens_details":{"cached_tokens":`...), u.CachedTokens, 10)
	dst = strconv.AppendInt(append(dst, `},"output_tokens":`...), u.CompletionTokens, 10)
	dst = strconv.AppendInt(append(dst, `,"output_tokens_details":{"reasoning_tokens":`...), u.ReasoningTokens, 10)
	dst = strconv.AppendInt(append(dst, `},"total_tokens":`...), u.PromptTokens+u.CompletionTokens, 10)
	return append(dst, '}')
}

// waitRecorded waits for record's channel, at most meter.DurableWait.
func (c *generationCall) waitRecorded(safe <-chan struct{}) {
	if !meter.WaitSafe(safe) {
		c.server.logf("meter: usage event %s not on disk after %s; answering anyway", c.reqID, meter.DurableWait)
	}
}

// counting reports whether event will count text with the tokenizer:
// no usage was reported, or output came after the last report.
func (c *generationCall) counting() bool {
	return !c.haveUsage || len(c.text) > 0 || c.textTokens > 0 || len(c.rawChunks) > 0
}

// event is the call's usage event. Where the upstream never reported
// usage, the prompt and the text actually forwarded are counted with the
// tokenizer and the event says so; so is output forwarded after the last
// report, added to it.
func (c *generationCall) event(status int) *meter.Event {
	u := c.usage
	source := meter.SourceUpstream
	c.textOfRawChunks()
	c.countKeptText()
	var after, reasoningAfter int64 // the output's tokens no report counted, and of its reasoning
	if len(c.text) > 0 || c.textTokens > 0 {
		after = c.completionEstimate()
		reasoningAfter = c.reasoningEstimate(after)
	}
	if !c.haveUsage {
		source = meter.SourceEstimated
		u.PromptTokens = c.countedPrompt() + c.toolOutputTokens + int64(tokens.Count(bstr(c.toolOutput)))
		u.CompletionTokens, u.ReasoningTokens = after, reasoningAfter
	} else if after > 0 {
		source = meter.SourceEstimated
		u.CompletionTokens += after
		u.ReasoningTokens += reasoningAfter
	}
	c.logRefusedUsage(after)
	if c.entry.Prices.Image != 0 {
		u.Images = countImages(*c.reqBody, c.ep)
	}
	return &meter.Event{
		ID:               c.reqID,
		Time:             c.start.UTC(),
		Account:          c.key.Account,
		KeyID:            c.key.ID,
		Endpoint:         c.ep.path(),
		Model:            c.entry.ID,
		Upstream:         c.upstream.cfg.Name,
		PromptTokens:     u.PromptTokens,
		CachedTokens:     u.CachedTokens,
		CompletionTokens: u.CompletionTokens,
		ReasoningTokens:  u.ReasoningTokens,
		Images:           u.Images,
		CostNanos:        c.entry.Prices.Cost(u),
		UsageSource:      source,
		Status:           status,
		Latency:          time.Since(c.start),
		TTFB:             c.ttfb,
		Stream:           c.stream,
		Log:              c.requestLog(),
	}
}

// requestLog is what a logging key exchanged: the client's request as sent
// and the answer (the body, or for streams the assembled text).
func (c *generationCall) requestLog() *meter.RequestLog {
	if !c.logging.Enabled {
		return nil
	}
	if !c.eventStream {
		// A whole body, to a streamed request too (wholestream.go): its
		// stream's text was never assembled, and the log was empty.
		return &meter.RequestLog{Request: c.logRequest, Response: string(c.logResponse), RetentionDays: c.logging.RetentionDays}
	}
	return &meter.RequestLog{Request: c.logRequest, Response: string(c.logText), ResponseLeftOut: c.logLeftOut,
		RetentionDays: c.logging.RetentionDays}
}

// promptText gathers the text of a request's messages (chat) or input and
// instructions (responses), for estimating prompt tokens.
func promptText(body []byte, ep endpoint) string {
	var sb strings.Builder
	add := func(content gjson.Result) {
		if content.Type == gjson.String {
			sb.WriteString(content.Str)
			sb.WriteByte('\n')
			return
		}
		content.ForEach(func(_, part gjson.Result) bool {
			// A refusal part of an earlier answer is text the model
			// reads, and so is a text file's content; other files (a
			// PDF) are not estimated.
			for _, key := range [...]string{"text", "refusal"} {
				if t := part.Get(key); t.Type == gjson.String {
					sb.WriteString(t.Str)
					sb.WriteByte('\n')
				}
			}
			fileData := part.Get("file_data") // responses' input_file
			if fileData.Type != gjson.String {
				fileData = part.Get("file.file_data") // chat's file
			}
			if text, ok := textOfDataURL(fileData.Str); ok {
				sb.Write(text)
				sb.WriteByte('\n')
			}
			return true
		})
	}
	// Tool definitions reach the model as text too, and so do the tool
	// calls and results of earlier turns: counted as their JSON and text.
	if tools := gjson.Get(bstr(body), "tools"); tools.IsArray() {
		sb.WriteString(tools.Raw)
		sb.WriteByte('\n')
	}
	// So does a structured output's schema, as OpenAI bills it: left out,
	// a large schema on a call with no usage report went unbilled.
	schema := "response_format.json_schema.schema"
	if ep == endpointResponses {
		schema = "text.format.schema"
	}
	if s := gjson.Get(bstr(body), schema); s.IsObject() {
		sb.WriteString(s.Raw)
		sb.WriteByte('\n')
	}
	if ep == endpointChat {
		gjson.Get(bstr(body), "messages").ForEach(func(_, m gjson.Result) bool {
			add(m.Get("content"))
			m.Get("tool_calls").ForEach(func(_, tc gjson.Result) bool {
				add(tc.Get("function.name"))
				add(tc.Get("function.arguments"))
				return true
			})
			return true
		})
		return sb.String()
	}
	add(gjson.Get(bstr(body), "instructions"))
	input := gjson.Get(bstr(body), "input")
	if input.Type == gjson.String {
		add(input)
	} else {
		input.ForEach(func(_, item gjson.Result) bool {
			content := item.Get("content")
			add(content)
			if !holdsText(content) {
				// A reasoning item's text may be its summary alone,
				// which vLLM reads where the content has none.
				add(item.Get("summary"))
			}
			add(item.Get("name"))
			add(item.Get("arguments"))
			add(item.Get("input")) // a custom tool's call
			add(item.Get("code"))  // a code interpreter's call
			add(item.Get("output"))
			if item.Get("type").Str == "mcp_list_tools" {
				// Tools an MCP server listed in an earlier turn, replayed:
				// definitions, counted as the top-level tools are.
				if tools := item.Get("tools"); tools.IsArray() {
					sb.WriteString(tools.Raw)
					sb.WriteByte('\n')
				}
			}
			return true
		})
	}
	return sb.String()
}

// textOfDataURL is the content of a data URL whose media type is text
// (text/*, JSON, XML, YAML), base64 or percent-encoded, for the prompt's
// estimate; ok is false for any other (a PDF, an image, a file sent by
// id), whose tokens the tokenizer cannot tell.
func textOfDataURL(s string) (text []byte, ok bool) {
	rest, found := strings.CutPrefix(s, "data:")
	if !found {
		return nil, false
	}
	header, data, found := strings.Cut(rest, ",")
	if !found {
		return nil, false
	}
	mediaType, params, _ := strings.Cut(header, ";")
	mediaType = strings.ToLower(strings.TrimSpace(mediaType))
	switch {
	case strings.HasPrefix(mediaType, "text/"), mediaType == "application/json", mediaType == "application/xml",
		mediaType == "application/yaml", mediaType == "application/x-yaml",
		strings.HasSuffix(mediaType, "+json"), strings.HasSuffix(mediaType, "+xml"):
	default:
		return nil, false
	}
	if strings.HasSuffix(params, "base64") {
		text, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(data, "="))
		return text, err == nil
	}
	unescaped, err := url.PathUnescape(data)
	if err != nil {
		return []byte(data), true
	}
	return []byte(unescaped), true
}

// countImages counts image inputs, billed at the model's image price:
// those of a message's content and, in responses, those a tool returned,
// in a function's or custom tool's output list or as a computer call's
// screenshot, which the model sees as it sees the others (they were
// free).
func countImages(body []byte, ep endpoint) int64 {
	var n int64
	list, kind := "messages", "image_url"
	if ep == endpointResponses {
		list, kind = "input", "input_image"
	}
	countParts := func(parts gjson.Result) {
		parts.ForEach(func(_, part gjson.Result) bool {
			if part.Get("type").Str == kind {
				n++
			}
			return true
		})
	}
	gjson.Get(bstr(body), list).ForEach(func(_, m gjson.Result) bool {
		countParts(m.Get("content"))
		if ep != endpointResponses {
			return true
		}
		switch output := m.Get("output"); {
		case output.IsArray():
			countParts(output)
		case output.IsObject():
			if typ := output.Get("type").Str; typ == "computer_screenshot" || typ == kind {
				n++
			}
		}
		return true
	})
	return n
}
