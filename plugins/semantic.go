package plugins

import (
	"errors"
	"io/fs"
	"log"
	"sync"

	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/config"
)

const engineSemantic = classifiers.EngineSemantic

// semanticEngines holds the semantic engine of each vectors file the
// config has named (usually one, for the life of the process): a reload
// that names another file loads it on first use, and one that cannot be
// loaded is remembered, so the warning is logged once, not per request.
var semanticEngines = struct {
	sync.Mutex
	byPath map[string]semanticLoad
	logf   func(string, ...any)
}{byPath: map[string]semanticLoad{}, logf: log.Printf}

type semanticLoad struct {
	engine classifiers.Engine // nil when the file could not be loaded
	err    error
}

// LoadVectors loads the semantic engine's vectors named by cfg now, so
// that `tollgate serve` says at start whether semantic is there, with
// logf; without it the first request that needs them loads them.
func LoadVectors(cfg *config.Config, logf func(string, ...any)) {
	semanticEngines.Lock()
	semanticEngines.logf = logf
	semanticEngines.Unlock()
	if _, err := semanticEngine(cfg.Plugins.Vectors); err == nil {
		logf("semantic engine: word vectors from %s", cfg.Plugins.Vectors)
	}
}

// semanticEngine returns the semantic engine over the vectors at path,
// or why there is none.
func semanticEngine(path string) (classifiers.Engine, error) {
	semanticEngines.Lock()
	defer semanticEngines.Unlock()
	if l, ok := semanticEngines.byPath[path]; ok {
		return l.engine, l.err
	}
	var l semanticLoad
	v, err := classifiers.LoadVectors(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		l.err = errors.New("the vectors file " + path + " is missing: run scripts/vectors.sh install (make run and make test do)")
	case err != nil:
		l.err = errors.New("the vectors file " + path + " cannot be used (" + err.Error() + "): run scripts/vectors.sh install again")
	default:
		l.engine = classifiers.NewSemantic(v)
	}
	if l.err != nil {
		semanticEngines.logf("warning: semantic engine unavailable, offline answers come from the lexical engine: %v", l.err)
	}
	semanticEngines.byPath[path] = l
	return l.engine, l.err
}

// offlineChoice is the engine that answers when no upstream does:
// semantic when its vectors are loaded, else lexical. The response names
// whichever answered.
func offlineChoice(p config.Plugins) *engineChoice {
	if e, err := semanticEngine(p.Vectors); err == nil {
		return &engineChoice{engine: e, name: engineSemantic}
	}
	return lexicalChoice()
}

// offline reports whether name is an engine that never calls an upstream.
func offline(name string) bool { return name == engineLexical || name == engineSemantic }
