package config

import (
	"fmt"
	"strings"
)

// Family describes a setting that a binary declares once per member of a
// list it reads at start (a flag and a variable per member, such as
// -alpha-wait and -beta-wait), so that its doc need not change when a
// member is added. Declare each member's setting as usual, then mark it
// with [Var.Of]. Flag, Env and Usage stand for every member in
// [Set.Markdown]: write the member's part of the names as a placeholder,
// such as "<member>-wait" and "<MEMBER>_WAIT" (Env may be "" for
// flag-only settings), and say in Usage which members there are. Default
// is the default of a member that has none of its own: the one a member
// added later gets.
type Family[T any] struct {
	Flag    string
	Env     string
	Usage   string
	Default T
}

// family is the type-erased part of a [Family] that a setting belongs to.
type family struct {
	id               any // the *Family[T]: its members share it
	flag, env, usage string
	def              string // Default as the usage text shows defaults
	member           string // the member this setting is declared for
}

// Of marks the setting as member's setting of family f, and returns it.
// The usage text (-h), the errors and [Set.Entries] still name the
// member's own flag and variable, with its own default and meaning.
// [Set.Markdown] shows the family as one row, where the family's first
// setting was declared, with f's flag, variable and meaning, and as
// default f.Default followed by each member whose default differs, in
// declaration order ("`5s` (`beta`: `10s`)"): a member added with the
// family's default changes nothing in the doc. The settings of a family
// are marked with the same *Family; member is the name the row's default
// gives the setting. A family with a secret member shows "(secret)". Of
// panics on a nil f or an empty member, which are programming errors.
func (v *Var[T]) Of(f *Family[T], member string) *Var[T] {
	if f == nil || member == "" {
		panic(fmt.Sprintf("config: setting -%s: a family member needs a family and a name", v.s.flag))
	}
	v.s.fam = &family{id: f, flag: f.Flag, env: f.Env, usage: f.Usage, def: v.format(f.Default), member: member}
	return v
}

// DocDefault sets what [Set.Markdown] shows as the setting's default:
// md, a Markdown text (a "|" in it is escaped), instead of the default's
// value. It is for a default that the doc should not spell out, such as
// one computed from a list that grows; the usage text (-h) still shows
// the value. It returns the setting.
func (v *Var[T]) DocDefault(md string) *Var[T] {
	v.s.docDef = md
	return v
}

// markdownRows returns the table rows of the Set's settings, one per
// setting and one per family, in declaration order.
func (s *Set) markdownRows() []string {
	var rows []string
	done := map[any]bool{}
	for _, st := range s.settings {
		if st.fam == nil {
			rows = append(rows, row(st.flag, st.env, defaultCell(st), st.usage))
			continue
		}
		if done[st.fam.id] {
			continue
		}
		done[st.fam.id] = true
		rows = append(rows, s.familyRow(st.fam))
	}
	return rows
}

// familyRow is the row of family f: its default, then the members' own
// defaults where they differ.
func (s *Set) familyRow(f *family) string {
	def := "`" + mdEscape(f.def) + "`"
	if f.def == "" {
		def = "(none)"
	}
	var own []string
	for _, st := range s.settings {
		if st.fam == nil || st.fam.id != f.id {
			continue
		}
		if st.secret {
			return row(f.flag, f.env, "(secret)", f.usage)
		}
		if st.def != f.def {
			own = append(own, "`"+mdEscape(st.fam.member)+"`: "+defaultCell(st))
		}
	}
	if len(own) > 0 {
		def += " (" + strings.Join(own, ", ") + ")"
	}
	return row(f.flag, f.env, def, f.usage)
}

// defaultCell is the default column of a setting of its own.
func defaultCell(st *setting) string {
	switch {
	case st.secret:
		return "(secret)"
	case st.docDef != "":
		return strings.NewReplacer("|", `\|`, "\n", " ").Replace(st.docDef)
	case st.def == "":
		return "(none)"
	}
	return "`" + mdEscape(st.def) + "`"
}

// row is one line of the Markdown table.
func row(flag, env, def, usage string) string {
	e := "—"
	if env != "" {
		e = "`" + env + "`"
	}
	return fmt.Sprintf("| `-%s` | %s | %s | %s |\n", flag, e, def, mdEscape(usage))
}
