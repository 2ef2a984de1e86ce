// Package docs holds no code: its tests check the project's Markdown
// documentation, README.md, docs/*.md and the binaries' own READMEs. Every
// relative link must resolve to a file, and a link to a heading
// (file.md#anchor) to a heading of that file; the README stays short enough
// to read in one sitting; and the README's test command is the one CI runs.
//
// It is not imported by anything.
package docs
