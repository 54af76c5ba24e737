// Package plugins holds the gateway's internal endpoints (classify, tag,
// score, match, batch). Each registers its routes with proxy.Register from
// init(); importing this package for side effects pulls them all in.
package plugins
