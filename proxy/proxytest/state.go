package proxytest

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// Responses state, as vLLM (and OpenAI) keep it: a /v1/responses call that
// does not say "store": false is kept in memory by its id, so
//
//	GET    /v1/responses/{id}              answers the response object
//	                                       (?stream=true: as one
//	                                       response.completed event)
//	DELETE /v1/responses/{id}              forgets it
//	POST   /v1/responses/{id}/cancel       cancels a background one
//	GET    /v1/responses/{id}/input_items  lists its input (limit, order)
//
// and a call with a previous_response_id this server does not hold gets
// vLLM's 404; one whose input names an item (item_reference) that is not
// the output item of a response it holds gets OpenAI's 404 "Item with id
// '…' not found.". An id it does not hold is 404 "Response with id '…' not
// found." on every route. Nothing is kept under Options.NoRecord.

// storedResponse is one kept response.
type storedResponse struct {
	body  []byte   // the response object, as GET answers it
	items [][]byte // input items, each a JSON object with an id
}

// keep stores a response answered with body for the request js. The stored
// body is rendered from the completed (or, for background, queued)
// template with the request's values, so a stream's response is kept as
// its response.completed event carries it.
func (s *Server) keep(st *rendered, js string, background bool, sc *scratch) {
	tmpl := st.respBody
	if background {
		tmpl = st.respQueued
	}
	id := string(sc.vals.id)
	r := &storedResponse{body: tmpl.appendTo(nil, &sc.vals), items: inputItems(js, id)}
	s.mu.Lock()
	if s.responses == nil {
		s.responses = map[string]*storedResponse{}
	}
	s.responses[id] = r
	if s.items == nil {
		s.items = map[string]string{}
	}
	s.items[string(sc.vals.itemID)] = id
	s.mu.Unlock()
}

// StoredItem reports whether the server holds the output item with this
// id (that of a response it still holds).
func (s *Server) StoredItem(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp, ok := s.items[id]
	return ok && s.responses[resp] != nil
}

// missingItem is the id of the first item_reference in js's input that
// this server does not hold, or "".
func (s *Server) missingItem(js string) string {
	missing := ""
	gjson.Get(js, "input").ForEach(func(_, v gjson.Result) bool {
		if v.Get("type").Str != "item_reference" {
			return true
		}
		if id := v.Get("id").Str; !s.StoredItem(id) {
			missing = id
			return false
		}
		return true
	})
	return missing
}

// itemNotFound is OpenAI's 404 for an item_reference it does not hold.
func itemNotFound(id string) []byte {
	return []byte(`{"error":{"message":` + jsonString("Item with id '"+id+"' not found.") +
		`,"type":"invalid_request_error","param":"input","code":null}}`)
}

func (s *Server) stored(id string) *storedResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.responses[id]
}

// Stored reports whether the server holds the response with this id.
func (s *Server) Stored(id string) bool { return s.stored(id) != nil }

// Forget drops a stored response, as if the server had lost it (a restart).
func (s *Server) Forget(id string) {
	s.mu.Lock()
	delete(s.responses, id)
	s.mu.Unlock()
}

// inputItems turns a request's input into input items: a string is one
// user message; an array's objects are kept as they are, given an id when
// they have none.
func inputItems(js, respID string) [][]byte {
	input := gjson.Get(js, "input")
	itemID := func(i int) string { return "in_" + strings.TrimPrefix(respID, "resp_") + "_" + strconv.Itoa(i) }
	if input.Type == gjson.String {
		return [][]byte{[]byte(`{"id":"` + itemID(0) + `","type":"message","role":"user","content":[{"type":"input_text","text":` +
			jsonString(input.Str) + `}]}`)}
	}
	var items [][]byte
	input.ForEach(func(_, v gjson.Result) bool {
		if !v.IsObject() {
			return true
		}
		raw := v.Raw
		if !v.Get("id").Exists() {
			inner := strings.TrimSpace(raw[1 : len(raw)-1])
			sep := ","
			if inner == "" {
				sep = ""
			}
			raw = `{"id":"` + itemID(len(items)) + `"` + sep + inner + "}"
		}
		items = append(items, []byte(raw))
		return true
	})
	return items
}

// responseNotFound is vLLM's 404 for an id it does not hold.
func responseNotFound(id string) []byte {
	return []byte(`{"error":{"message":` + jsonString("Response with id '"+id+"' not found.") +
		`,"type":"invalid_request_error","param":null,"code":null}}`)
}

var bodyNotCancellable = errorEnvelope(http.StatusBadRequest, "Cannot cancel a synchronous response.")

// responseState serves the routes under /v1/responses/; rest is the path
// after that prefix.
func (s *Server) responseState(w http.ResponseWriter, r *http.Request, o *Options, rest string, sc *scratch) outcome {
	id, action, _ := strings.Cut(rest, "/")
	if id == "" || strings.Contains(action, "/") {
		return s.respond(w, r, o, http.StatusNotFound, bodyNotFound, sc)
	}
	want := map[string]string{"": "GET DELETE", "cancel": "POST", "input_items": "GET"}[action]
	switch {
	case want == "":
		return s.respond(w, r, o, http.StatusNotFound, bodyNotFound, sc)
	case !strings.Contains(want, r.Method):
		return s.respond(w, r, o, http.StatusMethodNotAllowed, bodyBadMethod, sc)
	}
	s.mu.Lock()
	stored := s.responses[id]
	var body []byte
	switch {
	case stored == nil:
	case action == "cancel":
		if i := bytes.Index(stored.body, []byte(`"status":"queued"`)); i >= 0 {
			stored.body = append(stored.body[:i:i], append([]byte(`"status":"cancelled"`), stored.body[i+len(`"status":"queued"`):]...)...)
			body = stored.body
		}
	case r.Method == http.MethodDelete:
		delete(s.responses, id)
		body = []byte(`{"id":` + jsonString(id) + `,"object":"response","deleted":true}`)
	case action == "input_items":
		body = itemList(stored.items, r)
	default:
		body = stored.body
	}
	s.mu.Unlock()
	switch {
	case stored == nil:
		return s.respond(w, r, o, http.StatusNotFound, responseNotFound(id), sc)
	case body == nil:
		return s.respond(w, r, o, http.StatusBadRequest, bodyNotCancellable, sc)
	case action == "" && r.Method == http.MethodGet && r.URL.Query().Get("stream") == "true":
		ev := compile("event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":0,\"response\":" +
			string(body) + "}\n\n")
		return s.stream(w, r, o, []template{ev}, sc)
	}
	return s.respond(w, r, o, http.StatusOK, body, sc)
}

// itemList is the input_items page: limit (1..100, default 20) items in
// order (desc, the default, or asc).
func itemList(items [][]byte, r *http.Request) []byte {
	q := r.URL.Query()
	limit, err := strconv.Atoi(q.Get("limit"))
	if err != nil || limit < 1 || limit > 100 {
		limit = 20
	}
	order := make([][]byte, len(items))
	for i, it := range items {
		if q.Get("order") == "asc" {
			order[i] = it
		} else {
			order[len(items)-1-i] = it
		}
	}
	// after is the last id of the page before (the SDKs' auto-paging);
	// without it every page repeated the first and the client never
	// stopped.
	if after := q.Get("after"); after != "" {
		for i, it := range order {
			if gjson.GetBytes(it, "id").Str == after {
				order = order[i+1:]
				break
			}
		}
	}
	more := len(order) > limit
	if more {
		order = order[:limit]
	}
	b := []byte(`{"object":"list","data":[`)
	b = append(b, bytes.Join(order, []byte(","))...)
	b = append(b, "],"...)
	first, last := "null", "null"
	if len(order) > 0 {
		first = jsonString(gjson.GetBytes(order[0], "id").Str)
		last = jsonString(gjson.GetBytes(order[len(order)-1], "id").Str)
	}
	b = append(b, `"first_id":`+first+`,"last_id":`+last+`,"has_more":`+strconv.FormatBool(more)+"}"...)
	return b
}
