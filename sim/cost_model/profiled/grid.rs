//! Piecewise-linear interpolation over a profiler's sweep ([`Grid`]): measured times at
//! points of one to four size axes (tokens; or prefill chunk, its cached KV, decodes and
//! their KV). A profiler sweeps the union of several geometric grids, so the points of one
//! axis differ from slice to slice; the grid therefore nests one axis in the other and
//! interpolates one axis at a time, each slice between its own neighbours. In: rows of
//! `(coordinates, time)`; out: a time at any coordinates.

use std::cmp::Ordering;

/// One axis of a nested grid: sorted points, each holding the next axis (or a time).
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Time(f64),
    Axis(Vec<(f64, Node)>),
}

/// Times measured over a nested grid of `dims` axes.
#[derive(Debug, Clone, PartialEq)]
pub struct Grid {
    dims: usize,
    root: Node,
}

/// Two rows at the same coordinates.
#[derive(Debug, Clone, PartialEq)]
pub struct Duplicate {
    /// The row (0-based, in the order given) that repeats an earlier one.
    pub row: usize,
}

impl Grid {
    /// Builds a grid from rows of `dims` coordinates and a time each; a row that repeats
    /// another's coordinates is an error. Rows of another length are a caller's bug.
    pub fn new(dims: usize, rows: &[(Vec<f64>, f64)]) -> Result<Grid, Duplicate> {
        let mut root = Node::Axis(Vec::new());
        for (i, (coords, t)) in rows.iter().enumerate() {
            debug_assert_eq!(coords.len(), dims);
            let mut node = &mut root;
            for (d, &x) in coords.iter().enumerate() {
                let Node::Axis(points) = node else {
                    unreachable!("a grid's depth is fixed")
                };
                let at = match points.binary_search_by(|(k, _)| k.total_cmp(&x)) {
                    Ok(_) if d + 1 == dims => return Err(Duplicate { row: i }),
                    Ok(at) => at,
                    Err(at) => {
                        let child = if d + 1 == dims {
                            Node::Time(*t)
                        } else {
                            Node::Axis(Vec::new())
                        };
                        points.insert(at, (x, child));
                        at
                    }
                };
                node = &mut points[at].1;
            }
        }
        Ok(Grid { dims, root })
    }

    /// Whether the grid holds no point.
    pub fn is_empty(&self) -> bool {
        matches!(&self.root, Node::Axis(p) if p.is_empty())
    }

    /// The time at `coords`: linear between a slice's two neighbouring points; below its
    /// first point, the first point's time (a kernel costs at least its smallest measured
    /// launch); above its last, the line through its last two points, never below the last
    /// time (work grows linearly with size past the sweep). An empty grid is 0.
    pub fn at(&self, coords: &[f64]) -> f64 {
        debug_assert_eq!(coords.len(), self.dims);
        eval(&self.root, coords)
    }
}

fn eval(node: &Node, coords: &[f64]) -> f64 {
    let points = match node {
        Node::Time(t) => return *t,
        Node::Axis(points) => points,
    };
    let (x, rest) = (coords[0], &coords[1..]);
    let value = |i: usize| eval(&points[i].1, rest);
    match points.len() {
        0 => 0.0,
        1 => value(0),
        n => {
            let hi = points.partition_point(|(k, _)| k.total_cmp(&x) == Ordering::Less);
            if hi == 0 {
                value(0)
            } else if hi == n {
                let (x0, x1) = (points[n - 2].0, points[n - 1].0);
                let (y0, y1) = (value(n - 2), value(n - 1));
                (y1 + (y1 - y0) / (x1 - x0) * (x - x1)).max(y1)
            } else if points[hi].0 == x {
                value(hi)
            } else {
                let (x0, x1) = (points[hi - 1].0, points[hi].0);
                let (y0, y1) = (value(hi - 1), value(hi));
                y0 + (y1 - y0) * (x - x0) / (x1 - x0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn grid1(points: &[(f64, f64)]) -> Grid {
        let rows: Vec<_> = points.iter().map(|&(x, t)| (vec![x], t)).collect();
        Grid::new(1, &rows).unwrap()
    }

    #[test]
    fn one_axis_interpolates_clamps_and_extrapolates() {
        let g = grid1(&[(16.0, 10.0), (32.0, 20.0), (64.0, 60.0)]);
        assert_eq!(g.at(&[16.0]), 10.0);
        assert_eq!(g.at(&[24.0]), 15.0);
        assert_eq!(g.at(&[48.0]), 40.0);
        // Below the sweep: the smallest measured time.
        assert_eq!(g.at(&[1.0]), 10.0);
        // Past it: the last segment's slope.
        assert_eq!(g.at(&[128.0]), 140.0);
    }

    #[test]
    fn extrapolation_never_falls_below_the_last_point() {
        let g = grid1(&[(16.0, 10.0), (32.0, 8.0)]);
        assert_eq!(g.at(&[1000.0]), 8.0);
    }

    #[test]
    fn slices_keep_their_own_points() {
        // Axis 2 is sampled at {0, 100} for x = 0 and at {0, 50, 100} for x = 10.
        let rows = vec![
            (vec![0.0, 0.0], 0.0),
            (vec![0.0, 100.0], 100.0),
            (vec![10.0, 0.0], 10.0),
            (vec![10.0, 50.0], 20.0),
            (vec![10.0, 100.0], 110.0),
        ];
        let g = Grid::new(2, &rows).unwrap();
        assert_eq!(g.at(&[0.0, 50.0]), 50.0);
        assert_eq!(g.at(&[10.0, 50.0]), 20.0);
        // Halfway along axis 1: the mean of the two slices' values.
        assert_eq!(g.at(&[5.0, 50.0]), 35.0);
    }

    #[test]
    fn repeated_coordinates_are_named() {
        let rows = vec![(vec![1.0, 2.0], 1.0), (vec![1.0, 2.0], 3.0)];
        assert_eq!(Grid::new(2, &rows), Err(Duplicate { row: 1 }));
        assert!(Grid::new(1, &[]).unwrap().is_empty());
    }

    proptest! {
        /// Every measured point is reproduced, and between points a monotone sweep stays
        /// monotone and within its neighbours.
        #[test]
        fn exact_at_points_and_monotone_between(
            steps in proptest::collection::vec((1.0f64..100.0, 0.0f64..50.0), 2..20),
            q in 0.0f64..1.0,
        ) {
            let mut x = 0.0;
            let mut t = 1.0;
            let mut points = Vec::new();
            for (dx, dt) in steps {
                x += dx;
                t += dt;
                points.push((x, t));
            }
            let g = grid1(&points);
            for &(x, t) in &points {
                prop_assert_eq!(g.at(&[x]), t);
            }
            let (lo, hi) = (points[0].0, points[points.len() - 1].0);
            let probe = lo + q * (hi - lo);
            let v = g.at(&[probe]);
            prop_assert!(v >= points[0].1 - 1e-9 && v <= points[points.len() - 1].1 + 1e-9);
            prop_assert!(g.at(&[probe + 1.0]) >= v - 1e-9);
        }
    }
}
