package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Setting is the value of one setting of cfg, named by its path in
// gateway.yaml ("server.data_dir"), as the file gives it after loading:
// variables expanded and config defaults filled in. A value the gateway
// derives only when it runs (storage.local.public_base_url from
// storage.local.listen, server.public_url from each request) is not filled
// in: left empty in the file, it is empty here. A list item is named by its
// index ("models.0.id", or "models[0].id" as errors write it) and a map
// entry by its key ("classifiers.support-intent.mode"). Single values are
// printed, durations as the file writes them (8760h), and a list of them
// one a line; a section, a list of sections or a map is refused with what
// it holds.
func Setting(cfg *Config, path string) (string, error) {
	v := reflect.ValueOf(cfg).Elem()
	walked := ""
	names := settingNames(path)
	for i := 0; i < len(names); i++ {
		name := names[i]
		switch v.Kind() {
		case reflect.Struct:
			field, ok := fieldByYAMLName(v, name)
			if !ok {
				return "", fmt.Errorf("no setting %s: %s holds %s", joinSetting(walked, name), orTop(walked), strings.Join(yamlNames(v.Type()), ", "))
			}
			v = field
		case reflect.Slice:
			n, err := strconv.Atoi(name)
			if err != nil || n < 0 || n >= v.Len() {
				return "", fmt.Errorf("no setting %s: %s", joinSetting(walked, name), describeList(walked, v))
			}
			v = v.Index(n)
		case reflect.Map:
			// A key may hold dots: the shortest run of names that is one.
			found := false
			for j := i + 1; j <= len(names) && !found; j++ {
				if entry := v.MapIndex(reflect.ValueOf(strings.Join(names[i:j], "."))); entry.IsValid() {
					name, v, i, found = strings.Join(names[i:j], "."), entry, j-1, true
				}
			}
			if !found {
				return "", fmt.Errorf("no setting %s: %s", joinSetting(walked, name), describeMap(walked, v))
			}
		default:
			return "", fmt.Errorf("%s is a single value: it has no %s", walked, name)
		}
		walked = joinSetting(walked, name)
	}
	switch v.Kind() {
	case reflect.Struct:
		return "", fmt.Errorf("%s is a section: name one of its settings, %s", walked, strings.Join(yamlNames(v.Type()), ", "))
	case reflect.Slice:
		if !plainValue(v.Type().Elem()) {
			return "", errors.New(describeList(walked, v))
		}
		// A list of plain values (input_modalities, trusted_proxies):
		// one a line, for a script to read.
		items := make([]string, v.Len())
		for i := range items {
			items[i] = settingValue(v.Index(i))
		}
		return strings.Join(items, "\n"), nil
	case reflect.Map:
		return "", errors.New(describeMap(walked, v))
	case reflect.Pointer, reflect.Interface:
		return "", fmt.Errorf("%s is not a single value", walked)
	}
	return settingValue(v), nil
}

// plainValue says whether a value of t prints on a line of its own.
func plainValue(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Struct, reflect.Slice, reflect.Map, reflect.Pointer, reflect.Interface:
		return false
	}
	return true
}

// settingValue is a single value as the file writes it: a duration in
// its shortest exact form (8760h, 1m, 1h30m), not Go's (8760h0m0s).
func settingValue(v reflect.Value) string {
	if d, ok := v.Interface().(time.Duration); ok {
		return shortDuration(d)
	}
	if s, ok := v.Interface().(fmt.Stringer); ok {
		return s.String()
	}
	return fmt.Sprint(v.Interface())
}

// shortDuration is d.String() without the zero minutes and seconds it
// ends with: 8760h0m0s is 8760h, 1m0s is 1m.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// settingNames splits a setting's path into its names, reading an index
// written as errors write it ("models[0].id") as one more name.
func settingNames(path string) []string {
	path = strings.NewReplacer("[", ".", "]", "").Replace(path)
	return strings.Split(path, ".")
}

func describeList(walked string, v reflect.Value) string {
	if v.Len() == 0 {
		return walked + " is an empty list"
	}
	return fmt.Sprintf("%s is a list of %d: name an item by its index, 0 to %d, such as %s.0", walked, v.Len(), v.Len()-1, walked)
}

func describeMap(walked string, v reflect.Value) string {
	if v.Len() == 0 {
		return fmt.Sprintf("%s is an empty map", walked)
	}
	keys := make([]string, 0, v.Len())
	for _, k := range v.MapKeys() {
		keys = append(keys, k.String())
	}
	slices.Sort(keys)
	return fmt.Sprintf("%s is a map: name one of its keys, %s", walked, strings.Join(keys, ", "))
}

func joinSetting(walked, name string) string {
	if walked == "" {
		return name
	}
	return walked + "." + name
}

func orTop(walked string) string {
	if walked == "" {
		return "the file"
	}
	return walked
}

// fieldByYAMLName is v's field that gateway.yaml names name.
func fieldByYAMLName(v reflect.Value, name string) (reflect.Value, bool) {
	t := v.Type()
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag == name && t.Field(i).IsExported() {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

func yamlNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag != "" && tag != "-" && t.Field(i).IsExported() {
			names = append(names, tag)
		}
	}
	return names
}
