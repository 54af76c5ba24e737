package plugins

import (
	"errors"
	"io/fs"
	"log"
	"sync"
	"time"

	"github.com/tollgate/tollgate/classifiers"
)

const engineSemantic = classifiers.EngineSemantic

// vectorSet holds the semantic engine of each vectors file the config of
// one server has named (usually one, for the life of the server): a
// reload that names another file loads it on first use. A file that
// cannot be loaded is remembered until the next reload, so the warning is
// logged once, not per request, and an admin who fixes the file and
// reloads the config (or names a good one) gets semantic back without a
// restart; a missing file is looked for again by the first call at least
// missingVectorsRetry after the last look, so installing it is enough. A file once loaded stays loaded, its private copy mapped, for
// the life of the process: requests in flight may still read it, and a change
// to the file on disk reaches neither them nor later requests.
type vectorSet struct {
	mu     sync.Mutex
	byPath map[string]semanticLoad
	logf   func(string, ...any)
}

func newVectorSet() *vectorSet {
	return &vectorSet{byPath: map[string]semanticLoad{}, logf: log.Printf}
}

type semanticLoad struct {
	engine classifiers.Engine // nil when the file could not be loaded
	err    error
	// missingAt is when the file was found missing (zero otherwise).
	missingAt time.Time
}

// missingVectorsRetry is how often calls look again for a missing vectors
// file. An install writes beside it and renames, so the file found is
// whole. Saving gateway.yaml unchanged reloads nothing (config.Watcher
// reads only new content), and a file installed after start stayed
// unused until the config was edited or SIGHUP sent.
var missingVectorsRetry = 5 * time.Second

// forgetFailures makes the next use of a file that could not be loaded
// try again.
func (v *vectorSet) forgetFailures() {
	v.mu.Lock()
	defer v.mu.Unlock()
	for path, l := range v.byPath {
		if l.err != nil {
			delete(v.byPath, path)
		}
	}
}

// engine returns the semantic engine over the vectors at path, or why
// there is none.
func (v *vectorSet) engine(path string) (classifiers.Engine, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	prev, seen := v.byPath[path]
	if seen && (prev.missingAt.IsZero() || time.Since(prev.missingAt) < missingVectorsRetry) {
		return prev.engine, prev.err
	}
	var l semanticLoad
	vec, err := classifiers.LoadVectors(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		l.err = errors.New("the vectors file " + path + " is missing: run scripts/vectors.sh install (make run and make test do)")
		l.missingAt = time.Now()
		if seen && !prev.missingAt.IsZero() {
			v.byPath[path] = l // still missing: said already
			return nil, l.err
		}
	case errors.Is(err, classifiers.ErrVectorsCorrupt):
		// err names the file and the fix already; said once each.
		l.err = errors.New("the vectors file " + path + " is corrupt or truncated: run scripts/vectors.sh install again")
	case err != nil:
		l.err = errors.New("the vectors file " + path + " cannot be used (" + err.Error() + "): run scripts/vectors.sh install again")
	default:
		l.engine = classifiers.NewSemantic(vec)
		// The shape tells an install that fell back to GloVe alone (100
		// dimensions) from the joined vectors (612): see scripts/vectors.sh.
		v.logf("semantic engine: word vectors from %s (%d words × %d dimensions)", path, vec.Len(), vec.Dims())
	}
	if l.err != nil {
		v.logf("warning: semantic engine unavailable, offline answers come from the lexical engine: %v", l.err)
	}
	v.byPath[path] = l
	return l.engine, l.err
}

// offlineChoice is the engine that answers when no upstream does:
// semantic when its vectors are loaded, else lexical. The response names
// whichever answered.
func (m *module) offlineChoice(vectors string) *engineChoice {
	if e, err := m.vectors.engine(vectors); err == nil {
		return &engineChoice{engine: e, name: engineSemantic}
	}
	return lexicalChoice()
}

// offline reports whether name is an engine that never calls an upstream.
func offline(name string) bool { return name == engineLexical || name == engineSemantic }
