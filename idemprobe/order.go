package idemprobe

import (
	"errors"
	"fmt"
)

// runOrder returns the indexes of table's rows in the order they run: the
// baseline first; then, again and again, the first row in the table's
// order whose after have all run; then the rows marked afterAll, in the
// table's order. The table's order decides all else, so that the requests
// a probe sends, and the counter values in their bodies, are the same from
// one run to the next.
func runOrder(table []check) ([]int, error) {
	index := make(map[string]int, len(table))
	baseline := -1
	for i, c := range table {
		if _, dup := index[c.name]; dup {
			return nil, fmt.Errorf("two checks are named %q", c.name)
		}
		index[c.name] = i
		if c.baseline {
			if baseline >= 0 {
				return nil, fmt.Errorf("checks %q and %q are both the baseline", table[baseline].name, c.name)
			}
			baseline = i
		}
		if c.run == nil {
			return nil, fmt.Errorf("check %q has no run function", c.name)
		}
	}
	if baseline < 0 {
		return nil, errors.New("no check is the baseline")
	}
	if table[baseline].afterAll || len(table[baseline].after) > 0 {
		return nil, fmt.Errorf("the baseline %q cannot wait for other checks", table[baseline].name)
	}
	for _, c := range table {
		for _, name := range c.after {
			j, ok := index[name]
			switch {
			case !ok:
				return nil, fmt.Errorf("check %q runs after %q, which is not in the table", c.name, name)
			case table[j].afterAll && !c.afterAll:
				return nil, fmt.Errorf("check %q runs after %q, which runs after every other check", c.name, name)
			}
		}
	}

	order := []int{baseline}
	ran := make([]bool, len(table))
	ran[baseline] = true
	ready := func(c check) bool {
		for _, name := range c.after {
			if !ran[index[name]] {
				return false
			}
		}
		return true
	}
	for _, lastPass := range []bool{false, true} {
		for progress := true; progress; {
			progress = false
			for i, c := range table {
				if !ran[i] && c.afterAll == lastPass && ready(c) {
					order, ran[i], progress = append(order, i), true, true
					break
				}
			}
		}
	}
	if len(order) < len(table) {
		var stuck []string
		for i, c := range table {
			if !ran[i] {
				stuck = append(stuck, c.name)
			}
		}
		return nil, fmt.Errorf("checks %q wait for each other", stuck)
	}
	return order, nil
}

// mustRunOrder is runOrder for the package's own table, which every test
// of the package loads: a table that cannot run is a mistake in this code.
func mustRunOrder(table []check) []int {
	order, err := runOrder(table)
	if err != nil {
		panic("probe: " + err.Error())
	}
	return order
}
